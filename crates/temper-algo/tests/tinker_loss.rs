//! Tinker's losses against PyTorch running the Tinker docs' own snippets
//! (tools/tinker_loss_reference.py, float64; `stable_reinforce` against temper's published
//! reading of it, written there independently): the loss value and its gradient with respect to
//! the training logprobs, for default and custom `loss_fn_config`, ratios inside and outside the
//! clip range, log-ratios beyond +-20 (not clamped, as in Tinker's snippets), negative
//! cross-entropy weights, a GSPO ratio mask and StableReinforce's sampled positions. And the
//! request errors a server returns.
mod reference;

use std::collections::BTreeMap;

use serde::Deserialize;
use tch::{Kind, Tensor};
use temper_algo::TinkerLoss;

#[derive(Deserialize)]
struct Case {
    loss_fn: String,
    config: BTreeMap<String, f64>,
    lp: Vec<f64>,
    logprobs: Vec<f64>,
    advantages: Vec<f64>,
    weights: Vec<f64>,
    #[serde(default)]
    mask: Vec<f64>,
    #[serde(default)]
    recorded: Vec<f64>,
    loss: f64,
    grad: Vec<f64>,
}

fn reference() -> Vec<Case> {
    reference::tool_json("tinker_loss_reference.py")
}

#[test]
fn losses_and_gradients_match_pytorch() {
    let cases = reference();
    assert_eq!(cases.len(), 52);
    for c in &cases {
        let loss = TinkerLoss::from_request(&c.loss_fn, &c.config).unwrap();
        let lp = Tensor::from_slice(&c.lp).set_requires_grad(true);
        let input = |name: &str| -> Tensor {
            Tensor::from_slice(match name {
                "logprobs" => &c.logprobs,
                "advantages" => &c.advantages,
                "weights" => &c.weights,
                "sequence_ratio_mask" | "sampled_mask" => &c.mask,
                "recorded_logprobs" => &c.recorded,
                other => panic!("{other}"),
            })
        };
        let l = loss.datum_loss(&lp, &input).unwrap();
        l.backward();
        let value = l.to_kind(Kind::Double).double_value(&[]);
        assert!(
            (value - c.loss).abs() <= 1e-12 * c.loss.abs().max(1.0),
            "{} {:?}: loss {value} vs {}",
            c.loss_fn,
            c.config,
            c.loss
        );
        let grad = Vec::<f64>::try_from(lp.grad()).unwrap();
        for (g, w) in grad.iter().zip(&c.grad) {
            assert!(
                (g - w).abs() <= 1e-12 * w.abs().max(1.0),
                "{} {:?}: grad {grad:?} vs {:?}",
                c.loss_fn,
                c.config,
                c.grad
            );
        }
    }
}

#[test]
fn request_errors_name_the_problem() {
    let none = BTreeMap::new();
    let err = |name: &str, cfg: &[(&str, f64)]| {
        let cfg: BTreeMap<String, f64> = cfg.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        TinkerLoss::from_request(name, &cfg)
            .unwrap_err()
            .to_string()
    };
    assert!(err("custom", &[]).contains("with forward_backward_custom"));
    assert!(err("gspo", &[("kl_coeff", 0.1)]).contains("`kl_coeff` does not apply"));
    assert!(err("stable_reinforce", &[("kl_coeff", -1.0)]).contains("must be a finite number >= 0"));
    assert_eq!(
        TinkerLoss::from_request("stable_reinforce", &none).unwrap(),
        TinkerLoss::StableReinforce {
            kl_coeff: 0.0,
            ratio_cap: 2.0
        }
    );
    assert!(err("ppo2", &[]).starts_with("unknown loss_fn `ppo2`"));
    assert!(err("ppo", &[("beta", 0.1)]).contains("`beta` does not apply to loss_fn `ppo`"));
    assert!(err("cispo", &[("clip_low_threshold", 2.0)]).contains("must not exceed"));
    assert_eq!(
        TinkerLoss::from_request("dro", &none).unwrap(),
        TinkerLoss::Dro { beta: 0.05 }
    );
    assert_eq!(
        TinkerLoss::from_request("ppo", &none).unwrap(),
        TinkerLoss::Ppo { lo: 0.8, hi: 1.2 }
    );
}
