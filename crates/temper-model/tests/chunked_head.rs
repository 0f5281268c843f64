//! The chunked unembedding (`CausalLm::score_tokens` + `TokenScores::backward`) against libtorch's
//! own autograd over the full (B, T, V) logits: the same log-probs and entropies (f32, 1e-6) and
//! the same gradient on every parameter (1e-5 relative), for chunks that cut across rows, with a
//! LoRA'd unembedding, at a temperature, and with positions whose gradient is zero.
mod gguf_util;

use tch::{Device, Kind, Tensor};
use temper_model::{
    logprobs_and_entropy, position_ids_from_mask, CausalLm, ComputeKind, LoraConfig, ModelConfig,
};

fn model(lora: bool) -> CausalLm {
    let cfg = ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, false);
    let mut m = CausalLm::random(cfg, 11, Device::Cpu, ComputeKind::F32);
    if lora {
        let lc = LoraConfig {
            rank: 4,
            alpha: 8.0,
            target_modules: vec!["all-linear".into(), "lm_head".into()],
        };
        m.add_lora_seeded(&lc, 3).unwrap();
        // B != 0, so every adapter contributes.
        tch::no_grad(|| {
            for (_, p) in m.trainable_parameters() {
                let _ = p.shallow_clone().normal_(0.0, 0.05);
            }
        });
    }
    m
}

/// A left-padded batch: ids, mask, positions, next-token targets.
fn batch() -> (Tensor, Tensor, Tensor, Tensor) {
    let rows: [&[i64]; 3] = [
        &[5, 17, 3, 44, 9, 2, 31, 60, 12],
        &[60, 1, 8, 8],
        &[90, 91, 2, 3, 4, 5, 6],
    ];
    let t = rows.iter().map(|r| r.len()).max().unwrap();
    let (mut ids, mut mask) = (vec![], vec![]);
    for r in rows {
        let pad = t - r.len();
        ids.extend(std::iter::repeat_n(0, pad).chain(r.iter().copied()));
        mask.extend(std::iter::repeat_n(0i64, pad).chain(std::iter::repeat_n(1, r.len())));
    }
    let shape = [rows.len() as i64, t as i64];
    let ids = Tensor::from_slice(&ids).view(shape);
    let mask = Tensor::from_slice(&mask).view(shape);
    let pos = position_ids_from_mask(&mask);
    let targets = ids.roll([-1], [1]);
    (ids, mask, pos, targets)
}

/// A loss of logp and entropy that weights positions differently and is zero on padding and on
/// the last column (so some positions carry no gradient at all).
fn loss(logp: &Tensor, ent: &Tensor, mask: &Tensor) -> Tensor {
    let (b, t) = logp.size2().unwrap();
    let coef = Tensor::arange(b * t, (Kind::Float, Device::Cpu))
        .view([b, t])
        .sin();
    let w = mask.to_kind(Kind::Float) * &coef;
    let w = w.narrow(1, 0, t - 1);
    (logp.narrow(1, 0, t - 1) * &w).sum(Kind::Float)
        + (ent.narrow(1, 0, t - 1) * w.abs()).sum(Kind::Float) * 0.1
}

/// The gradients ([`peek`]), then zeroed in place.
fn grads(m: &CausalLm) -> Vec<(String, Tensor)> {
    let out = peek(m);
    for (_, p) in m.trainable_parameters() {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    out
}

fn check(lora: bool, temperature: f64) {
    let m = model(lora);
    let (ids, mask, pos, targets) = batch();
    // Reference: autograd over the full logits.
    let hidden = m.forward_hidden(&ids, &pos, &mask, None);
    let (lp_ref, ent_ref) = logprobs_and_entropy(&m.logits(&hidden), &targets, temperature);
    loss(&lp_ref, &ent_ref, &mask).backward();
    let want = grads(&m);
    assert!(want
        .iter()
        .any(|(_, g)| g.abs().sum(Kind::Float).double_value(&[]) > 0.0));
    for chunk in [1, 3, 5, 8, 1024] {
        let hidden = m.forward_hidden(&ids, &pos, &mask, None);
        let scores = m.score_tokens(&hidden, &targets, temperature, chunk);
        let d_lp = (&scores.logp - &lp_ref).abs().max().double_value(&[]);
        let d_en = (&scores.entropy - &ent_ref).abs().max().double_value(&[]);
        assert!(
            d_lp <= 1e-6 && d_en <= 1e-6,
            "lora={lora} T={temperature} chunk {chunk}: logp diff {d_lp:e}, entropy diff {d_en:e}"
        );
        loss(&scores.logp, &scores.entropy, &mask).backward();
        scores.backward();
        for ((name, g), (_, w)) in grads(&m).iter().zip(&want) {
            let rel = (g - w).norm().double_value(&[]) / w.norm().double_value(&[]).max(1e-30);
            assert!(
                rel <= 1e-5,
                "lora={lora} T={temperature} chunk {chunk}: {name}: relative gradient error {rel:e}"
            );
        }
    }
}

#[test]
fn chunked_unembedding_equals_full_logits_autograd() {
    check(false, 1.0);
    check(false, 0.7);
}

#[test]
fn chunked_unembedding_equals_full_logits_autograd_with_lora_head() {
    check(true, 1.0);
}

/// A loss with no gradient at the scores (all-zero weights) leaves every gradient as it was.
#[test]
fn zero_weights_leave_gradients_untouched() {
    let m = model(false);
    let (ids, mask, pos, targets) = batch();
    let hidden = m.forward_hidden(&ids, &pos, &mask, None);
    let scores = m.score_tokens(&hidden, &targets, 1.0, 4);
    (&scores.logp * 0.0).sum(Kind::Float).backward();
    scores.backward();
    assert!(grads(&m)
        .iter()
        .all(|(_, g)| g.abs().sum(Kind::Float).double_value(&[]) == 0.0));
}

/// Without autograd the scores are plain tensors, equal to the autograd ones bitwise.
#[test]
fn no_grad_scores_equal_the_training_forward_bitwise() {
    let m = model(false);
    let (ids, mask, pos, targets) = batch();
    let train = m.token_logprobs(&ids, &mask, &pos, &targets, 1.0);
    let (lp, _) = tch::no_grad(|| {
        m.token_logprobs(&ids, &mask, &pos, &targets, 1.0)
            .into_parts()
    });
    assert!(!lp.requires_grad());
    assert!(train.logp.requires_grad());
    assert!(bool::try_from(train.logp.detach().eq_tensor(&lp).all()).unwrap());
}

/// In bf16 the head's weight is cast to bf16 a block at a time, once per pass (not once per
/// chunk): on a vocabulary of one block the scores are bitwise those of `logits` (which casts the
/// whole weight itself), with and without autograd, and the backward gives autograd's gradients
/// over those logits.
#[test]
fn bf16_scores_cast_the_head_once_and_give_the_same_bits() {
    let cfg = ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, true);
    let m = CausalLm::random(cfg, 5, Device::Cpu, ComputeKind::Bf16);
    let (ids, mask, pos, targets) = batch();
    let hidden = m.forward_hidden(&ids, &pos, &mask, None);
    let (lp_ref, ent_ref) = logprobs_and_entropy(&m.logits(&hidden), &targets, 0.7);
    loss(&lp_ref, &ent_ref, &mask).backward();
    let want = grads(&m);
    let n = targets.numel() as i64;
    let same = |a: &Tensor, b: &Tensor| bool::try_from(a.detach().eq_tensor(b).all()).unwrap();
    let hidden = m.forward_hidden(&ids, &pos, &mask, None);
    let scores = m.score_tokens(&hidden, &targets, 0.7, n);
    assert!(same(&scores.logp, &lp_ref) && same(&scores.entropy, &ent_ref));
    let (lp, ent) = tch::no_grad(|| m.score_tokens(&hidden, &targets, 0.7, n).into_parts());
    assert!(same(&lp, &lp_ref) && same(&ent, &ent_ref));
    loss(&scores.logp, &scores.entropy, &mask).backward();
    scores.backward();
    let err = max_relative_error(&grads(&m), &want, 1.0);
    assert!(err <= 1e-6, "bf16 gradients: relative error {err:e}");
}

/// A vocabulary of several blocks (20,000 tokens: ten of `VOCAB_BLOCK`'s near-equal spans), tied
/// and untied, f32 and bf16, against autograd over the full logits: in f32 log-probs and entropies
/// within 1e-5 and every gradient within 1e-5 relative; in bf16 (the same bf16 logits, reduced in
/// another order) log-probs and entropies within 1e-4 and gradients within 1e-2 relative (the
/// hidden states' gradient is summed in f32 over the blocks and rounded to bf16 once, where
/// autograd's bf16 matmul rounds its own f32 sum: bf16 rounding apart, 4e-3).
#[test]
fn a_vocabulary_of_several_blocks_gives_autograd_scores_and_gradients() {
    let vocab = 20_000;
    assert!(vocab > 2 * temper_model::vocab_blocks::VOCAB_BLOCK);
    let (ids, mask, pos, targets) = batch();
    let (ids, targets) = (ids * 211 + 3, targets * 211 + 3);
    for tie in [true, false] {
        for (compute, tol_scores, tol_grads) in [
            (ComputeKind::F32, 1e-5, 1e-5),
            (ComputeKind::Bf16, 1e-4, 1e-2),
        ] {
            let cfg = ModelConfig::qwen2_like(vocab, 32, 48, 2, 4, 2, tie);
            let m = CausalLm::random(cfg, 9, Device::Cpu, compute);
            let hidden = m.forward_hidden(&ids, &pos, &mask, None);
            let (lp_ref, ent_ref) = logprobs_and_entropy(&m.logits(&hidden), &targets, 0.8);
            loss(&lp_ref, &ent_ref, &mask).backward();
            let want = grads(&m);
            let hidden = m.forward_hidden(&ids, &pos, &mask, None);
            let scores = m.score_tokens(&hidden, &targets, 0.8, 4);
            let d_lp = (&scores.logp - &lp_ref).abs().max().double_value(&[]);
            let d_en = (&scores.entropy - &ent_ref).abs().max().double_value(&[]);
            assert!(
                d_lp <= tol_scores && d_en <= tol_scores,
                "tie={tie} {compute:?}: logp diff {d_lp:e}, entropy diff {d_en:e}"
            );
            loss(&scores.logp, &scores.entropy, &mask).backward();
            scores.backward();
            let err = max_relative_error(&grads(&m), &want, 1.0);
            assert!(
                err <= tol_grads,
                "tie={tie} {compute:?}: relative gradient error {err:e}"
            );
        }
    }
}

/// The real vocabulary (SmolLM2-135M-Instruct, 49,152 tokens, tied embeddings): chunks of 8
/// against the full logits. On this vocabulary f32 rounding in the head moves the norm weights'
/// gradients by up to ~4e-5 relative (they are sums over tokens with cancellation), so the
/// gradients are held to a reference whose head runs in f64 (logits, log-softmax and entropy;
/// the decoder stays f32): log-probs and entropies within 1e-4 of it and no further than libtorch's
/// f32 over the full logits; each parameter's gradient within 2e-5 of it (the norm weights' sums
/// cancel), or no further from it than libtorch's f32 autograd over the full logits is, and on
/// average closer than that (the vocabulary blocks' sums measured 0.37x its error).
#[test]
fn chunked_unembedding_equals_full_logits_on_smollm2() {
    use temper_model::resolve::{resolve_model_with, SMOLLM2_ALIAS};
    let dir = resolve_model_with(SMOLLM2_ALIAS, &gguf_util::test_env()).unwrap();
    let m = CausalLm::load(&dir, Device::Cpu, ComputeKind::F32).unwrap();
    let (ids, mask, pos, targets) = batch();
    // Spread the ids over the vocabulary.
    let (ids, targets) = (ids * 331 + 7, targets * 331 + 7);

    // The head in f64: the unembedding (tied: the embedding) cast with autograd.
    let embedding = m
        .trainable_parameters()
        .into_iter()
        .find(|(n, _)| n == "model.embed_tokens.weight")
        .expect("SmolLM2 ties its head to the embedding")
        .1;
    let hidden = m.forward_hidden(&ids, &pos, &mask, None);
    let z = hidden
        .to_kind(Kind::Double)
        .matmul(&embedding.to_kind(Kind::Double).tr());
    let lse = z.logsumexp([-1], false);
    let lp64 = z.gather(-1, &targets.unsqueeze(-1), false).squeeze_dim(-1) - &lse;
    let ent64 = &lse
        - (z.softmax(-1, Kind::Double) * &z).sum_dim_intlist(
            [-1i64].as_slice(),
            false,
            Kind::Double,
        );
    loss(&lp64, &ent64, &mask).backward();
    let accurate = grads(&m);

    let hidden = m.forward_hidden(&ids, &pos, &mask, None);
    let (lp_ref, ent_ref) = logprobs_and_entropy(&m.logits(&hidden), &targets, 1.0);
    loss(&lp_ref, &ent_ref, &mask).backward();
    let full_f32 = grads(&m);

    let hidden = m.forward_hidden(&ids, &pos, &mask, None);
    let scores = m.score_tokens(&hidden, &targets, 1.0, 8);
    // Against the f64 head: within 1e-4, and no further than libtorch's f32 over full logits
    // (the vocabulary blocks' online log-sum-exp is the closer of the two: entropy 1.9e-5 against
    // 2.8e-4 off).
    let off = |a: &Tensor, b: &Tensor| (a.to_kind(Kind::Double) - b).abs().max().double_value(&[]);
    for (name, ours, full, exact) in [
        ("logp", &scores.logp, &lp_ref, &lp64),
        ("entropy", &scores.entropy, &ent_ref, &ent64),
    ] {
        let (d, d_full) = (off(ours, exact), off(full, exact));
        assert!(
            d <= 1e-4 && d <= d_full.max(1e-5),
            "{name}: {d:e} from the f64 head (full f32 logits: {d_full:e})"
        );
    }
    loss(&scores.logp, &scores.entropy, &mask).backward();
    scores.backward();
    let chunked = grads(&m);

    let rel = |g: &Tensor, w: &Tensor| {
        (g - w).norm().double_value(&[]) / w.norm().double_value(&[]).max(1e-30)
    };
    let (mut sum_chunked, mut sum_full) = (0.0, 0.0);
    for (((name, c), (_, f)), (_, a)) in chunked.iter().zip(&full_f32).zip(&accurate) {
        let (e_chunked, e_full) = (rel(c, a), rel(f, a));
        assert!(
            e_chunked <= 2e-5_f64.max(e_full),
            "{name}: relative gradient error {e_chunked:e} (f32 full logits: {e_full:e})"
        );
        sum_chunked += e_chunked;
        sum_full += e_full;
    }
    assert!(
        sum_chunked <= sum_full,
        "mean relative gradient error {:e}, f32 full logits {:e}",
        sum_chunked / chunked.len() as f64,
        sum_full / chunked.len() as f64
    );
}

/// Activation checkpointing (`forward_hidden_checkpointed`, each layer run again in the
/// backward): the same log-probs as the plain forward, bitwise, and every parameter's gradient
/// within 1e-5 relative of libtorch's autograd through the whole decoder and the full logits;
/// untied and tied embeddings (the embedding then gets its two contributions in another order),
/// with LoRA on every linear and the head.
#[test]
fn checkpointed_layers_give_autograd_gradients() {
    let tied = || {
        let cfg = ModelConfig::qwen2_like(97, 32, 48, 3, 4, 2, true);
        CausalLm::random(cfg, 5, Device::Cpu, ComputeKind::F32)
    };
    for (label, m) in [
        ("untied", model(false)),
        ("tied", tied()),
        ("lora", model(true)),
    ] {
        let (ids, mask, pos, targets) = batch();
        let hidden = m.forward_hidden(&ids, &pos, &mask, None);
        let (lp_ref, ent_ref) = logprobs_and_entropy(&m.logits(&hidden), &targets, 1.0);
        loss(&lp_ref, &ent_ref, &mask).backward();
        let want = grads(&m);
        let plain = tch::no_grad(|| m.score_tokens(&hidden, &targets, 1.0, 4).into_parts().0);

        let (hidden, checkpoints) = m.forward_hidden_checkpointed(&ids, &pos, &mask);
        let scores = m
            .score_tokens(&hidden, &targets, 1.0, 4)
            .with_checkpoints(checkpoints);
        assert!(
            scores.logp.equal(&plain),
            "{label}: checkpointed log-probs differ from the plain forward's"
        );
        loss(&scores.logp, &scores.entropy, &mask).backward();
        scores.backward();
        let got = grads(&m);
        assert!(got.len() == want.len() && !got.is_empty());
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            let rel = (g - w).norm().double_value(&[]) / w.norm().double_value(&[]).max(1e-30);
            assert!(
                rel <= 1e-5,
                "{label}: {name}: relative gradient error {rel:e}"
            );
            assert!(
                w.abs().sum(Kind::Float).double_value(&[]) > 0.0 || name.contains("lora_B"),
                "{label}: {name} got no gradient in the reference"
            );
        }
    }
}

/// Gradients as `.grad` holds them (undefined ones as zeros), leaving them in place.
fn peek(m: &CausalLm) -> Vec<(String, Tensor)> {
    m.trainable_parameters()
        .into_iter()
        .map(|(n, p)| {
            let g = p.grad();
            (
                n,
                if g.defined() {
                    g.copy()
                } else {
                    p.zeros_like()
                },
            )
        })
        .collect()
}

fn max_relative_error(got: &[(String, Tensor)], want: &[(String, Tensor)], scale: f64) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|((_, g), (_, w))| {
            let w = w * scale;
            (g - &w).norm().double_value(&[]) / w.norm().double_value(&[]).max(1e-30)
        })
        .fold(0.0, f64::max)
}

/// The unembedding's weight gradient is added into `.grad` in place once the weight has one, and
/// goes through autograd for its first: from fresh (undefined) gradients, a chunked backward gives
/// autograd's full-logits gradients (f32, 1e-5 relative), a second one adds the same again, and in
/// bf16 the in-place path equals autograd's over the same chunk (1e-6 relative).
#[test]
fn head_gradient_accumulates_in_place_from_fresh_and_existing_gradients() {
    let cfg = || ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, true);
    let (ids, mask, pos, targets) = batch();
    let chunked_backward = |m: &CausalLm, chunk: i64| {
        let hidden = m.forward_hidden(&ids, &pos, &mask, None);
        let scores = m.score_tokens(&hidden, &targets, 1.0, chunk);
        loss(&scores.logp, &scores.entropy, &mask).backward();
        scores.backward();
    };

    let reference = CausalLm::random(cfg(), 21, Device::Cpu, ComputeKind::F32);
    let hidden = reference.forward_hidden(&ids, &pos, &mask, None);
    let (lp, ent) = logprobs_and_entropy(&reference.logits(&hidden), &targets, 1.0);
    loss(&lp, &ent, &mask).backward();
    let want = peek(&reference);

    let m = CausalLm::random(cfg(), 21, Device::Cpu, ComputeKind::F32);
    assert!(m
        .trainable_parameters()
        .iter()
        .all(|(_, p)| !p.grad().defined()));
    chunked_backward(&m, 3);
    let once = max_relative_error(&peek(&m), &want, 1.0);
    assert!(once <= 1e-5, "fresh gradients: relative error {once:e}");
    chunked_backward(&m, 3);
    let twice = max_relative_error(&peek(&m), &want, 2.0);
    assert!(twice <= 1e-5, "added gradients: relative error {twice:e}");

    let m = CausalLm::random(cfg(), 21, Device::Cpu, ComputeKind::Bf16);
    chunked_backward(&m, 1024);
    let by_autograd = grads(&m);
    chunked_backward(&m, 1024);
    let in_place = max_relative_error(&peek(&m), &by_autograd, 1.0);
    assert!(
        in_place <= 1e-6,
        "bf16: in place vs autograd: relative error {in_place:e}"
    );
    let vs_f32 = max_relative_error(&by_autograd, &want, 1.0);
    assert!(
        vs_f32 <= 0.05,
        "bf16 vs f32 gradients: relative error {vs_f32:e}"
    );
}

/// The input embedding's gradient arrives as sparse rows added into `.grad` in place whenever a
/// dense `.grad` is certain to be there first (not as a vocabulary-sized dense gradient): an
/// untied model's first backward (no `.grad` yet: dense) and its second (sparse rows) give the
/// same gradient, and after a tied model's first backward every `.grad` is dense.
#[test]
fn the_embedding_gradient_adds_sparse_rows_into_a_dense_grad() {
    let (ids, mask, pos, targets) = batch();
    let backward = |m: &CausalLm| {
        let hidden = m.forward_hidden(&ids, &pos, &mask, None);
        let scores = m.score_tokens(&hidden, &targets, 1.0, 4);
        loss(&scores.logp, &scores.entropy, &mask).backward();
        scores.backward();
    };
    let embed = |m: &CausalLm| {
        let (_, p) = m
            .named_parameters()
            .into_iter()
            .find(|(n, _)| n == "model.embed_tokens.weight")
            .unwrap();
        p.grad()
    };
    let untied = CausalLm::random(
        ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, false),
        4,
        Device::Cpu,
        ComputeKind::F32,
    );
    backward(&untied);
    let dense = embed(&untied).copy();
    assert!(dense.abs().sum(Kind::Float).double_value(&[]) > 0.0);
    let _ = grads(&untied);
    backward(&untied);
    let rows = embed(&untied);
    assert!(!rows.is_sparse());
    let rel = (&rows - &dense).norm().double_value(&[]) / dense.norm().double_value(&[]);
    assert!(rel <= 1e-6, "sparse rows vs dense gradient: {rel:e}");

    let tied = CausalLm::random(
        ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, true),
        4,
        Device::Cpu,
        ComputeKind::F32,
    );
    backward(&tied);
    for (name, p) in tied.named_parameters() {
        assert!(!p.grad().is_sparse(), "{name}'s gradient is sparse");
    }
}

/// Trimming the heap in the backward (`set_trim_heap_in_backward`, on by default for models of
/// 300M parameters or more) changes no number: the gradients with it on equal those with it off
/// bit for bit, plain and checkpointed. The default follows the parameter count.
#[test]
fn trimming_the_heap_in_the_backward_changes_no_gradient() {
    let m = model(false);
    assert!(!m.trims_heap_in_backward());
    // Qwen2.5-0.5B's shape is above the default's bound, SmolLM2's below it.
    let qwen = ModelConfig::qwen2_like(151_936, 896, 4864, 24, 14, 2, true);
    let smol = ModelConfig::qwen2_like(49_152, 576, 1536, 30, 9, 3, true);
    assert!(qwen.num_params() >= temper_model::TRIM_HEAP_MIN_PARAMS);
    assert!(smol.num_params() < temper_model::TRIM_HEAP_MIN_PARAMS);
    let (ids, mask, pos, targets) = batch();
    for checkpointed in [false, true] {
        let mut runs = vec![];
        for trim in [false, true] {
            m.set_trim_heap_in_backward(trim);
            let scores = if checkpointed {
                let (hidden, c) = m.forward_hidden_checkpointed(&ids, &pos, &mask);
                m.score_tokens(&hidden, &targets, 1.0, 4)
                    .with_checkpoints(c)
            } else {
                let hidden = m.forward_hidden(&ids, &pos, &mask, None);
                m.score_tokens(&hidden, &targets, 1.0, 4)
            };
            loss(&scores.logp, &scores.entropy, &mask).backward();
            scores.backward();
            runs.push(grads(&m));
        }
        for ((name, a), (_, b)) in runs[0].iter().zip(&runs[1]) {
            assert!(a.equal(b), "checkpointed={checkpointed}: {name} differs");
        }
    }
}
