//! Gradients of a scalar loss (sum of coef * logp + 0.1 * entropy at temperature 0.7) w.r.t. weight
//! tensors, against transformers' autograd (tools/model_reference.py), on a left-padded batch.
mod common;

use common::{pad, reference};
use tch::{Device, Kind, Tensor};
use temper_model::{CausalLm, ComputeKind};

fn check(model_name: &str) {
    let r = reference(model_name);
    let model = CausalLm::load(&r.dir, Device::Cpu, ComputeKind::F32).unwrap();
    let b = pad(&r.rows, true, 1, 3);
    let scores = model.token_logprobs(&b.ids, &b.mask, &b.pos, &b.targets, r.temperature);
    let (logp, ent) = (&scores.logp, &scores.entropy);
    let coef = b.scatter(&r.coef);
    let valid = b.scatter(
        &r.coef
            .iter()
            .map(|c| vec![1.0; c.len()])
            .collect::<Vec<_>>(),
    );
    let loss = (&coef * logp).sum(Kind::Float) + (&valid * ent).sum(Kind::Float) * 0.1;
    loss.backward();
    scores.backward();
    let want: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(r.dir.join("grads.safetensors"))
            .unwrap()
            .into_iter()
            .collect();
    let vars = model.var_store().variables();
    for name in &r.grad_names {
        let g = vars[name].grad();
        let w = &want[name];
        let rel = f64::try_from((&g - w).norm()).unwrap() / f64::try_from(w.norm()).unwrap();
        assert!(
            rel <= 1e-3,
            "{model_name} {name}: relative gradient error {rel:e}"
        );
        assert!(
            f64::try_from(w.norm()).unwrap() > 0.0,
            "{name}: zero reference gradient"
        );
    }
}

#[test]
fn llama_gradients_match_transformers() {
    check("llama");
}

#[test]
fn qwen2_gradients_match_transformers() {
    check("qwen2");
}

#[test]
fn qwen3_gradients_match_transformers() {
    check("qwen3");
}
