//! Invariances the trainer relies on:
//! - splitting a mini-batch into micro-batches and accumulating gradients gives the loss and the
//!   gradient of the whole mini-batch, for every loss mode and aggregation mode (policy loss +
//!   KL loss - entropy bonus), however the micro-batches are padded;
//! - at r == 1 every loss with a ratio reports `ppo_kl == 0` and `pg_clipfrac == 0` exactly,
//!   in f32 and f64.

use tch::{Kind, Tensor};
use temper_algo::{
    actor_loss, ActorLossConfig, ActorLossInput, AggContext, AggMode, KlType, PolicyLossMode,
    PolicyLossParams,
};

/// Valid tokens per row: full, ragged, one token, none, ...
const LENGTHS: [i64; 7] = [7, 4, 1, 0, 5, 2, 6];
const T: i64 = 7;

fn mask() -> Tensor {
    let rows: Vec<f64> = LENGTHS
        .iter()
        .flat_map(|&n| (0..T).map(move |t| if t < n { 1.0 } else { 0.0 }))
        .collect();
    Tensor::from_slice(&rows).reshape([LENGTHS.len() as i64, T])
}

struct Batch {
    logp: Tensor,
    old: Tensor,
    reference: Tensor,
    adv: Tensor,
    mask: Tensor,
}

/// Deterministic uniform numbers in [0, 1) (tests run in parallel: no global RNG).
fn uniform(seed: u64, n: usize) -> Tensor {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        })
        .collect();
    Tensor::from_slice(&v).reshape([LENGTHS.len() as i64, T])
}

fn batch(kind: Kind) -> Batch {
    let n = LENGTHS.len() * T as usize;
    let logp = -(uniform(1, n) * 2.5 + 0.05);
    let old = &logp + (uniform(2, n) - 0.5) * 0.8;
    let reference = &logp + (uniform(3, n) - 0.5) * 1.2;
    let adv = (uniform(4, n) - 0.5) * 3.0;
    Batch {
        logp: logp.to_kind(kind),
        old: old.to_kind(kind),
        reference: reference.to_kind(kind),
        adv: adv.to_kind(kind),
        mask: mask(),
    }
}

fn config(mode: PolicyLossMode, agg: AggMode, lsf: Option<f64>) -> ActorLossConfig {
    ActorLossConfig {
        loss_mode: mode,
        params: PolicyLossParams {
            clip_ratio_high: Some(0.28),
            ..Default::default()
        },
        loss_agg_mode: agg,
        loss_scale_factor: lsf,
        use_kl_loss: true,
        kl_loss_coef: 0.1,
        kl_loss_type: "k3+".parse::<KlType>().unwrap(),
        entropy_coeff: 0.01,
    }
}

/// Loss of rows `rows` (padded to `t` columns) under `ctx`; gradients accumulate into `lp`.
fn micro_loss(
    cfg: &ActorLossConfig,
    b: &Batch,
    lp: &Tensor,
    rows: (i64, i64),
    t: i64,
    ctx: &AggContext,
) -> f64 {
    let cut = |x: &Tensor| x.narrow(0, rows.0, rows.1).narrow(1, 0, t);
    let logp = cut(lp);
    // A stand-in per-token entropy that depends on the parameters.
    let entropy = logp.square();
    let (old, reference, adv, mask) = (cut(&b.old), cut(&b.reference), cut(&b.adv), cut(&b.mask));
    let out = actor_loss(
        cfg,
        &ActorLossInput {
            log_prob: &logp,
            old_log_prob: Some(&old),
            ref_log_prob: Some(&reference),
            advantages: &adv,
            response_mask: &mask,
            entropy: Some(&entropy),
            rollout_is_weights: None,
        },
        ctx,
    )
    .unwrap();
    out.loss.backward();
    out.loss.double_value(&[])
}

fn assert_close(what: &str, a: &Tensor, b: &Tensor) {
    let diff = (a - b).abs().max().double_value(&[]);
    let scale = b.abs().max().double_value(&[]).max(1.0);
    assert!(diff <= 1e-12 * scale, "{what}: max diff {diff:e}");
}

/// Micro-batches of rows (start, len).
const SPLITS: [(i64, i64); 3] = [(0, 2), (2, 3), (5, 2)];

#[test]
fn micro_batches_sum_to_the_mini_batch() {
    let b = batch(Kind::Double);
    for &mode in PolicyLossMode::ALL {
        for &agg in AggMode::ALL {
            // (a) micro-batches padded like the mini-batch, S from the padding.
            // (b) each micro-batch trimmed to its longest row, S given explicitly.
            for trimmed in [false, true] {
                let lsf = if trimmed { Some(T as f64) } else { None };
                let cfg = config(mode, agg, lsf);
                let big_lp = b.logp.copy().set_requires_grad(true);
                let big_ctx = cfg.context(&[&b.mask]).unwrap();
                let big = micro_loss(&cfg, &b, &big_lp, (0, LENGTHS.len() as i64), T, &big_ctx);

                let lp = b.logp.copy().set_requires_grad(true);
                let widths: Vec<i64> = SPLITS
                    .iter()
                    .map(|&(s, n)| {
                        let longest = LENGTHS[s as usize..(s + n) as usize]
                            .iter()
                            .copied()
                            .max()
                            .unwrap_or(0);
                        if trimmed {
                            longest.max(1)
                        } else {
                            T
                        }
                    })
                    .collect();
                let masks: Vec<Tensor> = SPLITS
                    .iter()
                    .zip(&widths)
                    .map(|(&(s, n), &w)| b.mask.narrow(0, s, n).narrow(1, 0, w))
                    .collect();
                let ctx = cfg.context(&masks.iter().collect::<Vec<_>>()).unwrap();
                assert_eq!(ctx, big_ctx, "{mode} {agg}: context from micro-batch masks");
                let sum: f64 = SPLITS
                    .iter()
                    .zip(&widths)
                    .map(|(&rows, &w)| micro_loss(&cfg, &b, &lp, rows, w, &ctx))
                    .sum();
                let what = format!("{mode} / {agg} / trimmed={trimmed}");
                assert!(
                    (sum - big).abs() <= 1e-12 * big.abs().max(1.0),
                    "{what}: loss {sum} vs {big}"
                );
                assert!(
                    big_lp.grad().abs().sum(Kind::Double).double_value(&[]) > 0.0,
                    "{what}: zero gradient"
                );
                assert_close(&format!("{what}: gradient"), &lp.grad(), &big_lp.grad());
            }
        }
    }
}

#[test]
fn ratio_one_reports_exact_zeros() {
    for kind in [Kind::Float, Kind::Double] {
        let b = batch(kind);
        for &mode in PolicyLossMode::ALL {
            if !mode.needs_old() {
                continue;
            }
            let ctx = AggContext::from_mask(AggMode::TokenMean, &b.mask, None).unwrap();
            let out = temper_algo::policy_loss(
                mode,
                &PolicyLossParams::default(),
                &temper_algo::PolicyLossInput {
                    log_prob: &b.logp,
                    old_log_prob: Some(&b.logp.copy()),
                    advantages: &b.adv,
                    response_mask: &b.mask,
                    rollout_is_weights: None,
                    ratio_mask: None,
                },
                &ctx,
            )
            .unwrap();
            let metrics = out.metrics.read();
            for key in ["actor/ppo_kl", "actor/pg_clipfrac"] {
                let v = metrics.get(key).copied();
                assert_eq!(v, Some(0.0), "{mode} ({kind:?}): {key} = {v:?}");
                assert!(v.unwrap().is_sign_positive(), "{mode}: {key} is -0");
            }
            if let Some(&lower) = metrics.get("actor/pg_clipfrac_lower") {
                assert_eq!(lower, 0.0, "{mode} ({kind:?}): pg_clipfrac_lower");
            }
        }
    }
}

#[test]
fn f32_matches_f64() {
    let b64 = batch(Kind::Double);
    let b32 = batch(Kind::Float);
    for &mode in PolicyLossMode::ALL {
        for &agg in AggMode::ALL {
            let cfg = config(mode, agg, None);
            let run = |b: &Batch| {
                let lp = b.logp.copy().set_requires_grad(true);
                let ctx = cfg.context(&[&b.mask]).unwrap();
                let loss = micro_loss(&cfg, b, &lp, (0, LENGTHS.len() as i64), T, &ctx);
                (loss, lp.grad().to_kind(Kind::Double))
            };
            let ((l64, g64), (l32, g32)) = (run(&b64), run(&b32));
            assert!(
                (l64 - l32).abs() <= 1e-4 * l64.abs().max(1.0),
                "{mode} {agg}: {l32} vs {l64}"
            );
            let diff = (&g64 - &g32).abs().max().double_value(&[]);
            assert!(
                diff <= 1e-4,
                "{mode} {agg}: f32 gradient differs by {diff:e}"
            );
            assert_eq!(g32.kind(), Kind::Double);
        }
    }
}
