//! AReaL's decoupled PPO objective, as temper runs it for asynchronous runs: `rollout_correction`
//! with the trainer's recomputed log-probs as the proximal policy and the sampler's as the
//! behaviour policy (token level, `rollout_is_cap` truncate or drop), then the vanilla clipped
//! loss against the proximal policy with those weights. The reference is PyTorch written from
//! the AReaL paper (tools/decoupled_ppo_reference.py, float64) on answers whose tokens were
//! sampled by different policy versions (a partial rollout crossing weight updates): the loss
//! and its gradient with respect to the trained log-probs.

mod reference;

use serde::Deserialize;
use tch::{Kind, Tensor};
use temper_algo::{
    actor_loss, ActorLossConfig, ActorLossInput, AggContext, AggMode, CorrectionLevel, IsCap,
    PolicyLossMode, PolicyLossParams, RolloutCorrection,
};

#[derive(Deserialize)]
struct Case {
    eps_low: f64,
    eps_high: f64,
    cap: f64,
    cap_mode: String,
    rows: i64,
    versions: Vec<f64>,
    lp: Vec<f64>,
    prox: Vec<f64>,
    behav: Vec<f64>,
    adv: Vec<f64>,
    mask: Vec<f64>,
    loss: f64,
    grad: Vec<f64>,
}

fn reference() -> Vec<Case> {
    reference::tool_json("decoupled_ppo_reference.py")
}

#[test]
fn decoupled_objective_matches_areal_papers_formula() {
    let cases = reference();
    assert_eq!(cases.len(), 8);
    // Per cap mode: some case has a behaviour weight above its cap (the seed is fixed).
    let mut capped = std::collections::BTreeSet::new();
    for c in &cases {
        let t = |v: &[f64]| Tensor::from_slice(v).reshape([c.rows, -1]);
        let (prox, behav, mask) = (t(&c.prox), t(&c.behav), t(&c.mask));
        // The versions differ within rows: what the test is about.
        let versions = t(&c.versions);
        let spread = versions.max_dim(1, false).0 - versions.min_dim(1, false).0;
        assert!(spread.max().double_value(&[]) > 0.0);

        let corr = RolloutCorrection {
            rollout_is: Some(CorrectionLevel::Token),
            rollout_is_threshold: c.cap,
            rollout_is_cap: c.cap_mode.parse::<IsCap>().unwrap(),
            ..RolloutCorrection::default()
        };
        let out = temper_algo::rollout_correction(&prox, &behav, &mask, &corr).unwrap();
        let weights = out.rollout_is_weights.expect("token IS weights");
        let above = (&prox - &behav).exp().gt(c.cap).logical_and(&mask.gt(0.0));
        if above.any().int64_value(&[]) != 0 {
            capped.insert(c.cap_mode.clone());
        }

        let lp = t(&c.lp).set_requires_grad(true);
        let cfg = ActorLossConfig {
            loss_mode: PolicyLossMode::Vanilla,
            params: PolicyLossParams {
                clip_ratio_low: Some(c.eps_low),
                clip_ratio_high: Some(c.eps_high),
                // The paper's objective has no dual clip.
                clip_ratio_c: None,
                ..PolicyLossParams::default()
            },
            loss_agg_mode: AggMode::TokenMean,
            ..ActorLossConfig::default()
        };
        let ctx = AggContext::from_masks(AggMode::TokenMean, &[&out.response_mask], None).unwrap();
        let adv = t(&c.adv);
        let l = actor_loss(
            &cfg,
            &ActorLossInput {
                log_prob: &lp,
                old_log_prob: Some(&prox),
                ref_log_prob: None,
                advantages: &adv,
                response_mask: &out.response_mask,
                entropy: None,
                rollout_is_weights: Some(&weights),
            },
            &ctx,
        )
        .unwrap()
        .loss;
        l.backward();
        let value = l.to_kind(Kind::Double).double_value(&[]);
        let what = format!(
            "eps {}/{} cap {} {}",
            c.eps_low, c.eps_high, c.cap, c.cap_mode
        );
        assert!(
            (value - c.loss).abs() <= 1e-12 * c.loss.abs().max(1.0),
            "{what}: loss {value} vs {}",
            c.loss
        );
        let grad = Vec::<f64>::try_from(lp.grad().reshape([-1])).unwrap();
        for (g, w) in grad.iter().zip(&c.grad) {
            assert!(
                (g - w).abs() <= 1e-12 * w.abs().max(1.0),
                "{what}: grad {grad:?} vs {:?}",
                c.grad
            );
        }
    }
    assert_eq!(
        capped.into_iter().collect::<Vec<_>>(),
        ["drop", "truncate"],
        "a cap mode has no case with a behaviour weight above its cap"
    );
}
