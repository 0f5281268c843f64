//! Logprobs and entropy of the decoder against transformers (tools/model_reference.py), for Llama,
//! Qwen2 and Qwen3, on left- and right-padded batches (so also: padding invariance).
mod common;

use common::{max_abs_diff, pad, reference};
use tch::Device;
use temper_model::{CausalLm, ComputeKind};

fn check(model_name: &str, left: bool, extra: i64) {
    let r = reference(model_name);
    let model = CausalLm::load(&r.dir, Device::Cpu, ComputeKind::F32).unwrap();
    let b = pad(&r.rows, left, extra, 5);
    let (logp, ent) = tch::no_grad(|| {
        model
            .token_logprobs(&b.ids, &b.mask, &b.pos, &b.targets, 1.0)
            .into_parts()
    });
    let (d_lp, d_en) = (
        max_abs_diff(&b.per_row(&logp), &r.logp),
        max_abs_diff(&b.per_row(&ent), &r.entropy),
    );
    eprintln!("{model_name} left={left}: max |logp diff| {d_lp:e}, |entropy diff| {d_en:e}");
    assert!(
        d_lp <= 1e-4 && d_en <= 1e-4,
        "{model_name} left={left}: logp diff {d_lp:e}, entropy diff {d_en:e}"
    );
    let (logp, ent) = tch::no_grad(|| {
        model
            .token_logprobs(&b.ids, &b.mask, &b.pos, &b.targets, r.temperature)
            .into_parts()
    });
    let (d_lp, d_en) = (
        max_abs_diff(&b.per_row(&logp), &r.logp_t),
        max_abs_diff(&b.per_row(&ent), &r.entropy_t),
    );
    assert!(
        d_lp <= 1e-4 && d_en <= 1e-4,
        "{model_name} T={}: logp diff {d_lp:e}, entropy diff {d_en:e}",
        r.temperature
    );
}

#[test]
fn llama_matches_transformers_left_and_right_padding() {
    check("llama", true, 0);
    check("llama", false, 2);
}

#[test]
fn qwen2_matches_transformers_left_and_right_padding() {
    check("qwen2", true, 1);
    check("qwen2", false, 0);
}

#[test]
fn qwen3_matches_transformers_left_and_right_padding() {
    check("qwen3", true, 0);
    check("qwen3", false, 3);
}

/// Each row alone (no padding at all) gives the same numbers as inside the padded batch.
#[test]
fn padded_rows_equal_rows_alone() {
    let r = reference("qwen3");
    let model = CausalLm::load(&r.dir, Device::Cpu, ComputeKind::F32).unwrap();
    let b = pad(&r.rows, true, 2, 7);
    let batch = b.per_row(&tch::no_grad(|| {
        model
            .token_logprobs(&b.ids, &b.mask, &b.pos, &b.targets, 1.0)
            .logp
    }));
    for (i, row) in r.rows.iter().enumerate() {
        let one = pad(std::slice::from_ref(row), true, 0, 0);
        let alone = one.per_row(&tch::no_grad(|| {
            model
                .token_logprobs(&one.ids, &one.mask, &one.pos, &one.targets, 1.0)
                .logp
        }));
        let d = max_abs_diff(&alone, &batch[i..i + 1]);
        assert!(d <= 1e-5, "row {i}: padded vs alone differ by {d:e}");
    }
}

/// bf16 compute (f32 master weights, bf16 matmuls/attention) is as accurate as PyTorch's own CPU
/// autocast: its logprob error w.r.t. the f32 reference is within 1.5x of autocast's (mean and max).
#[test]
fn bf16_compute_is_as_accurate_as_torch_autocast() {
    for name in ["llama", "qwen2", "qwen3"] {
        let r = reference(name);
        let model = CausalLm::load(&r.dir, Device::Cpu, ComputeKind::Bf16).unwrap();
        let b = pad(&r.rows, true, 1, 0);
        let logp = tch::no_grad(|| {
            model
                .token_logprobs(&b.ids, &b.mask, &b.pos, &b.targets, 1.0)
                .logp
        });
        assert_eq!(logp.kind(), tch::Kind::Float);
        let errs: Vec<f64> = b
            .per_row(&logp)
            .iter()
            .zip(&r.logp)
            .flat_map(|(x, y)| {
                x.iter()
                    .zip(y)
                    .map(|(p, q)| (p - q).abs())
                    .collect::<Vec<_>>()
            })
            .collect();
        let mean = errs.iter().sum::<f64>() / errs.len() as f64;
        let max = errs.iter().cloned().fold(0.0, f64::max);
        eprintln!(
            "{name} bf16 |logp err|: mean {mean:.4} max {max:.4}; autocast mean {:.4} max {:.4}",
            r.autocast_bf16_mean_err, r.autocast_bf16_max_err
        );
        assert!(
            mean <= 1.5 * r.autocast_bf16_mean_err,
            "{name}: bf16 mean error {mean} vs autocast {}",
            r.autocast_bf16_mean_err
        );
        assert!(
            max <= 1.5 * r.autocast_bf16_max_err,
            "{name}: bf16 max error {max} vs autocast {}",
            r.autocast_bf16_max_err
        );
        assert!(
            mean > 0.0,
            "{name}: bf16 equals f32 exactly, so bf16 casts are not happening"
        );
    }
}

/// Small unembedding chunks give the same numbers (chunks of 5 positions cut across rows).
#[test]
fn chunked_no_grad_logprobs_match() {
    let r = reference("qwen2");
    let model = CausalLm::load(&r.dir, Device::Cpu, ComputeKind::F32).unwrap();
    let b = pad(&r.rows, false, 1, 0);
    let (lp, en) = tch::no_grad(|| {
        let hidden = model.forward_hidden(&b.ids, &b.pos, &b.mask, None);
        model
            .score_tokens(&hidden, &b.targets, r.temperature, 5)
            .into_parts()
    });
    assert!(!lp.requires_grad());
    let d_lp = max_abs_diff(&b.per_row(&lp), &r.logp_t);
    let d_en = max_abs_diff(&b.per_row(&en), &r.entropy_t);
    assert!(
        d_lp <= 1e-4 && d_en <= 1e-4,
        "chunked: logp diff {d_lp:e}, entropy diff {d_en:e}"
    );
}
