//! `torch.nn.utils.clip_grad_norm_(params, max_norm)` (L2), returning the pre-clip total norm.
use tch::Tensor;

/// Total L2 norm of all gradients (norm of the per-tensor norms, as PyTorch computes it), and
/// gradients scaled by `min(max_norm / (norm + 1e-6), 1)` when `max_norm > 0`.
/// Returns the norm before clipping (verl's `actor/grad_norm`); may be NaN/inf.
pub fn clip_grad_norm(params: &[(String, Tensor)], max_norm: f64) -> f64 {
    tch::no_grad(|| {
        let grads: Vec<Tensor> = params
            .iter()
            .map(|(_, p)| p.grad())
            .filter(|g| g.defined())
            .collect();
        if grads.is_empty() {
            return 0.0;
        }
        // `Tensor::norm` is ATen's 2-norm over all elements, the kernel behind linalg.vector_norm.
        let norms: Vec<Tensor> = grads.iter().map(|g| g.norm()).collect();
        let total = Tensor::stack(&norms, 0).norm();
        if max_norm > 0.0 {
            let coef =
                (Tensor::from(max_norm).to_kind(total.kind()) / (&total + 1e-6)).clamp_max(1.0);
            for mut g in grads {
                let _ = g.g_mul_(&coef);
            }
        }
        total.double_value(&[])
    })
}

/// Zero every defined gradient in place (`optimizer.zero_grad(set_to_none=False)`), after a step.
pub fn zero_grad(params: &[(String, Tensor)]) {
    tch::no_grad(|| {
        for (_, p) in params {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    });
}
