//! Shared-prefix forwards (`response_hidden_shared`) against the plain forward on every row's
//! full sequence (`token_logprobs`, itself checked against transformers in model_logprobs and
//! model_grads): per-token logprobs and entropies, and the gradient of every parameter, for groups
//! with different prompt lengths, group sizes and response lengths (left-padded prompts,
//! right-padded responses), in f32. On a tiny Qwen2 (biases, untied head), a tiny Qwen3 (q/k
//! norms) and the real SmolLM2-135M-Instruct.

mod gguf_util;

use tch::{Device, Kind, Tensor};
use temper_model::resolve::{resolve_model_with, SMOLLM2_ALIAS};
use temper_model::{
    position_ids_from_mask, CausalLm, ComputeKind, ModelConfig, SharedPrefixRows,
    DEFAULT_UNEMBED_CHUNK,
};

/// (prompt, [responses]) per group.
type Groups = Vec<(Vec<i64>, Vec<Vec<i64>>)>;

fn groups(vocab: i64, seed: u64) -> Groups {
    // Prompt lengths 5, 2, 7, 1; group sizes 3, 1, 2, 2; responses of 1..6 tokens.
    let mut x = seed;
    let mut next = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 33) as i64) % (vocab - 1) + 1
    };
    let shape: [(usize, &[usize]); 4] = [(5, &[3, 6, 1]), (2, &[4]), (7, &[2, 5]), (1, &[6, 6])];
    shape
        .iter()
        .map(|(p, rs)| {
            let prompt = (0..*p).map(|_| next()).collect();
            let responses = rs
                .iter()
                .map(|r| (0..*r).map(|_| next()).collect())
                .collect();
            (prompt, responses)
        })
        .collect()
}

fn tensor(v: Vec<i64>, rows: usize) -> Tensor {
    let n = v.len() as i64;
    Tensor::from_slice(&v).view([rows as i64, n / rows as i64])
}

/// How `run` computes the responses' scores.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    /// Every row's full sequence.
    Full,
    /// Each distinct prompt once.
    Shared,
    /// Either, with activation checkpointing.
    FullCheckpointed,
    SharedCheckpointed,
    /// Packed rows (`response_hidden_packed`): whole sequences, or shared prompts; either with
    /// checkpointing.
    Packed {
        shared: bool,
        checkpointed: bool,
    },
}

/// Loss = sum(coef * logp) + 0.1 * sum(entropy) over valid response tokens; returns (logp, entropy,
/// valid) and leaves the gradients in the model.
fn run(
    model: &CausalLm,
    g: &Groups,
    layout: Layout,
    pad: i64,
    chunk: i64,
) -> (Tensor, Tensor, Tensor) {
    let shared = matches!(layout, Layout::Shared | Layout::SharedCheckpointed);
    let checkpointed = matches!(
        layout,
        Layout::FullCheckpointed | Layout::SharedCheckpointed
    );
    let packed = match layout {
        Layout::Packed {
            shared,
            checkpointed,
        } => Some((shared, checkpointed)),
        _ => None,
    };
    let p = g.iter().map(|(q, _)| q.len()).max().unwrap();
    let r = g
        .iter()
        .flat_map(|(_, rs)| rs.iter().map(Vec::len))
        .max()
        .unwrap();
    let rows: Vec<(usize, &Vec<i64>)> = g
        .iter()
        .enumerate()
        .flat_map(|(gi, (_, rs))| rs.iter().map(move |resp| (gi, resp)))
        .collect();
    let left = |q: &Vec<i64>| -> (Vec<i64>, Vec<i64>) {
        let padn = p - q.len();
        let ids = std::iter::repeat_n(pad, padn)
            .chain(q.iter().copied())
            .collect();
        let mask = std::iter::repeat_n(0, padn)
            .chain(std::iter::repeat_n(1, q.len()))
            .collect();
        (ids, mask)
    };
    let right = |s: &Vec<i64>| -> (Vec<i64>, Vec<i64>) {
        let ids = s
            .iter()
            .copied()
            .chain(std::iter::repeat_n(pad, r - s.len()))
            .collect();
        let mask = std::iter::repeat_n(1, s.len())
            .chain(std::iter::repeat_n(0, r - s.len()))
            .collect();
        (ids, mask)
    };
    let (mut full_ids, mut full_mask) = (vec![], vec![]);
    for (gi, resp) in &rows {
        let (pi, pm) = left(&g[*gi].0);
        let (ri, rm) = right(resp);
        full_ids.extend(pi.into_iter().chain(ri));
        full_mask.extend(pm.into_iter().chain(rm));
    }
    let b = rows.len();
    let ids = tensor(full_ids, b);
    let mask = tensor(full_mask, b);
    let pos = position_ids_from_mask(&mask);
    let response_ids = ids.narrow(1, p as i64, r as i64);
    let valid = mask.narrow(1, p as i64, r as i64).to_kind(Kind::Float);
    let temperature = 0.7;
    let (scores, logp, ent) = if let Some((share, checkpoint)) = packed {
        let pairs: Vec<(&[i64], &[i64])> = rows
            .iter()
            .map(|(gi, resp)| (g[*gi].0.as_slice(), resp.as_slice()))
            .collect();
        let (hidden, ck) = model
            .response_hidden_packed(&pairs, r as i64, share, checkpoint)
            .unwrap();
        let scores = model.score_tokens(&hidden, &response_ids, temperature, chunk);
        let scores = match ck {
            Some(c) => scores.with_checkpoints(c),
            None => scores,
        };
        let (lp, en) = (scores.logp.shallow_clone(), scores.entropy.shallow_clone());
        (scores, lp, en)
    } else if shared {
        let (mut pids, mut pmask) = (vec![], vec![]);
        for (q, _) in g {
            let (i, m) = left(q);
            pids.extend(i);
            pmask.extend(m);
        }
        let prompt_ids = tensor(pids, g.len());
        let prompt_mask = tensor(pmask, g.len());
        let prompt_of_row =
            Tensor::from_slice(&rows.iter().map(|(gi, _)| *gi as i64).collect::<Vec<_>>());
        let rows = SharedPrefixRows {
            prompt_positions: &position_ids_from_mask(&prompt_mask),
            prompt_ids: &prompt_ids,
            prompt_mask: &prompt_mask,
            prompt_of_row: &prompt_of_row,
            response_ids: &response_ids,
            response_mask: &mask.narrow(1, p as i64, r as i64),
            response_positions: &pos.narrow(1, p as i64, r as i64),
        };
        let scores = if checkpointed {
            let (hidden, ck) = model.response_hidden_shared_checkpointed(&rows);
            model
                .score_tokens(&hidden, &response_ids, temperature, chunk)
                .with_checkpoints(ck)
        } else {
            let hidden = model.response_hidden_shared(&rows);
            model.score_tokens(&hidden, &response_ids, temperature, chunk)
        };
        let (lp, en) = (scores.logp.shallow_clone(), scores.entropy.shallow_clone());
        (scores, lp, en)
    } else {
        let targets = ids.roll([-1], [1]);
        let scores = if checkpointed {
            let (hidden, ck) = model.forward_hidden_checkpointed(&ids, &pos, &mask);
            model
                .score_tokens(&hidden, &targets, temperature, DEFAULT_UNEMBED_CHUNK)
                .with_checkpoints(ck)
        } else {
            model.token_logprobs(&ids, &mask, &pos, &targets, temperature)
        };
        let lp = scores.logp.narrow(1, p as i64 - 1, r as i64);
        let en = scores.entropy.narrow(1, p as i64 - 1, r as i64);
        (scores, lp, en)
    };
    let coef = Tensor::arange(r as i64, (Kind::Float, Device::Cpu))
        .sin()
        .unsqueeze(0)
        + 0.3;
    let loss = (&coef * &logp * &valid).sum(Kind::Float) + (&ent * &valid).sum(Kind::Float) * 0.1;
    loss.backward();
    scores.backward();
    (logp.detach(), ent.detach(), valid)
}

fn grads(model: &CausalLm) -> Vec<(String, Tensor)> {
    let out = model
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.grad().copy()))
        .collect();
    model.var_store().variables().values().for_each(|p| {
        let _ = p.grad().zero_();
    });
    out
}

/// `chunk`: positions per chunk of the unembedding in the shared run (the plain run takes the
/// default).
fn check(model: &CausalLm, g: &Groups, chunk: i64, tol_lp: f64, tol_grad: f64) {
    check_layout(model, g, Layout::Shared, chunk, tol_lp, tol_grad);
}

/// `layout` against every row's full sequence without checkpointing.
fn check_layout(
    model: &CausalLm,
    g: &Groups,
    layout: Layout,
    chunk: i64,
    tol_lp: f64,
    tol_grad: f64,
) {
    let (lp0, en0, valid) = run(model, g, Layout::Full, 0, chunk);
    let plain = grads(model);
    let (lp1, en1, _) = run(model, g, layout, 0, chunk);
    let shared = grads(model);
    let diff = |a: &Tensor, b: &Tensor| f64::try_from(((a - b) * &valid).abs().max()).unwrap();
    let (dl, de) = (diff(&lp0, &lp1), diff(&en0, &en1));
    assert!(
        dl <= tol_lp && de <= tol_lp,
        "logprob diff {dl:e}, entropy diff {de:e}"
    );
    assert_eq!(plain.len(), shared.len());
    for ((name, a), (_, b)) in plain.iter().zip(&shared) {
        let norm = f64::try_from(a.norm()).unwrap();
        assert!(norm > 0.0, "{name}: zero gradient");
        let rel = f64::try_from((a - b).norm()).unwrap() / norm;
        assert!(
            rel <= tol_grad,
            "{name}: relative gradient difference {rel:e}"
        );
    }
}

/// A tiny Qwen3 (q/k norms, tied head, one KV head), vocabulary 101.
fn tiny_qwen3() -> CausalLm {
    let qwen3 = ModelConfig::from_value(serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 101,
        "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2, "head_dim": 16,
        "num_attention_heads": 4, "num_key_value_heads": 1, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": true,
    }))
    .unwrap();
    CausalLm::random(qwen3, 2, Device::Cpu, ComputeKind::F32)
}

#[test]
fn shared_prefix_equals_full_rows_on_tiny_qwen2_and_qwen3() {
    let qwen2 = ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, false);
    let model = CausalLm::random(qwen2, 1, Device::Cpu, ComputeKind::F32);
    check(&model, &groups(97, 5), 3, 1e-5, 1e-5);

    let model = tiny_qwen3();
    check(&model, &groups(101, 9), 3, 1e-5, 1e-5);
}

/// Activation checkpointing, with and without shared prefixes, gives the full rows' log-probs and
/// gradients (tiny Qwen2 with biases and an untied head, tiny Qwen3 with q/k norms and a tied
/// one, one-token responses).
#[test]
fn checkpointed_layers_equal_full_rows_with_and_without_shared_prefixes() {
    let qwen2 = ModelConfig::qwen2_like(97, 32, 48, 3, 4, 2, false);
    let model = CausalLm::random(qwen2, 1, Device::Cpu, ComputeKind::F32);
    for layout in [Layout::FullCheckpointed, Layout::SharedCheckpointed] {
        check_layout(&model, &groups(97, 5), layout, 3, 1e-5, 1e-5);
    }
    let tied = ModelConfig::qwen2_like(50, 16, 24, 2, 2, 1, true);
    let model = CausalLm::random(tied, 4, Device::Cpu, ComputeKind::F32);
    let g: Groups = vec![
        (vec![3, 4, 5], vec![vec![7], vec![1, 2, 3]]),
        (vec![9], vec![vec![8], vec![2]]),
    ];
    // Every response one token long: only the prompts' last positions are scored.
    let ones: Groups = vec![
        (vec![3, 4, 5], vec![vec![7]]),
        (vec![9], vec![vec![8], vec![2]]),
    ];
    for layout in [Layout::FullCheckpointed, Layout::SharedCheckpointed] {
        check_layout(&model, &g, layout, 3, 1e-5, 1e-5);
        check_layout(&model, &ones, layout, 3, 1e-5, 1e-5);
    }
}

#[test]
fn a_one_token_response_and_one_row_groups_work() {
    let cfg = ModelConfig::qwen2_like(50, 16, 24, 1, 2, 1, true);
    let model = CausalLm::random(cfg, 4, Device::Cpu, ComputeKind::F32);
    let g: Groups = vec![
        (vec![3, 4, 5], vec![vec![7]]),
        (vec![9], vec![vec![8], vec![2]]),
    ];
    check(&model, &g, 3, 1e-5, 1e-5);
}

#[test]
fn shared_prefix_equals_full_rows_on_smollm2() {
    let dir = resolve_model_with(SMOLLM2_ALIAS, &gguf_util::test_env()).unwrap();
    let model = CausalLm::load(&dir, Device::Cpu, ComputeKind::F32).unwrap();
    check(&model, &groups(49152, 3), DEFAULT_UNEMBED_CHUNK, 5e-5, 1e-4);
}

/// Every packed layout (whole sequences or shared prompts, with and without checkpointing) gives
/// the padded full rows' log-probs, entropies and gradients: tiny Qwen2 (biases, untied head),
/// tiny Qwen3 (q/k norms, tied head), groups of different prompt and response lengths, one-token
/// responses.
#[test]
fn packed_rows_equal_padded_full_rows() {
    let layouts = [false, true].into_iter().flat_map(|shared| {
        [false, true].map(|checkpointed| Layout::Packed {
            shared,
            checkpointed,
        })
    });
    let layouts: Vec<Layout> = layouts.collect();
    let qwen2 = ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, false);
    let model = CausalLm::random(qwen2, 1, Device::Cpu, ComputeKind::F32);
    for &layout in &layouts {
        check_layout(&model, &groups(97, 5), layout, 3, 1e-5, 1e-5);
    }
    let model = tiny_qwen3();
    let ones: Groups = vec![
        (vec![3, 4, 5], vec![vec![7]]),
        (vec![9], vec![vec![8], vec![2]]),
    ];
    for &layout in &layouts {
        check_layout(&model, &groups(101, 9), layout, 3, 1e-5, 1e-5);
        check_layout(&model, &ones, layout, 3, 1e-5, 1e-5);
    }
}

/// Rows the packed layout cannot score are refused with the row's index.
#[test]
fn packed_rows_refuse_an_empty_prompt_and_a_response_wider_than_asked() {
    let cfg = ModelConfig::qwen2_like(50, 16, 24, 1, 2, 1, true);
    let model = CausalLm::random(cfg, 4, Device::Cpu, ComputeKind::F32);
    let empty: Vec<(&[i64], &[i64])> = vec![(&[1, 2], &[3]), (&[], &[4])];
    let err = model
        .response_hidden_packed(&empty, 1, false, false)
        .err()
        .expect("an empty prompt is refused");
    assert!(
        err.to_string().contains("row 1 has an empty prompt"),
        "{err}"
    );
    let wide: Vec<(&[i64], &[i64])> = vec![(&[1, 2], &[3, 4, 5])];
    let err = model
        .response_hidden_packed(&wide, 2, true, false)
        .err()
        .expect("a response wider than the width is refused");
    assert!(
        err.to_string().contains("row 0's response has 3 tokens"),
        "{err}"
    );
}
