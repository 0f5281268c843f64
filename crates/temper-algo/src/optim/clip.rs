//! `torch.nn.utils.clip_grad_norm_(params, max_norm)` (L2), returning the pre-clip total norm.
use tch::Tensor;

/// Total L2 norm of all gradients (norm of the per-tensor norms, as PyTorch computes it), and
/// gradients scaled by `min(max_norm / (norm + 1e-6), 1)` when `max_norm > 0`.
/// Returns the norm before clipping (verl's `actor/grad_norm`); may be NaN/inf. Reading it is the
/// step's one wait for the device.
pub fn clip_grad_norm(params: &[(String, Tensor)], max_norm: f64) -> anyhow::Result<f64> {
    Ok(clip_grad_norm_tensor(params, max_norm)?.map_or(0.0, |t| t.double_value(&[])))
}

/// [`clip_grad_norm`] with the norm left on the gradients' device (`None` without gradients):
/// PyTorch's foreach path, one call for every gradient of one device and dtype.
fn clip_grad_norm_tensor(
    params: &[(String, Tensor)],
    max_norm: f64,
) -> anyhow::Result<Option<Tensor>> {
    tch::no_grad(|| {
        let grads: Vec<Tensor> = params
            .iter()
            .map(|(_, p)| p.grad())
            .filter(|g| g.defined())
            .collect();
        let Some(first) = grads.first() else {
            return Ok(None);
        };
        let alike = grads
            .iter()
            .all(|g| g.device() == first.device() && g.kind() == first.kind());
        if alike {
            let refs: Vec<&Tensor> = grads.iter().collect();
            return temper_kernels::optim::clip_grad_norm(&refs, max_norm).map(Some);
        }
        // Mixed devices or dtypes: the same arithmetic one tensor at a time (PyTorch's per-group
        // norms gathered on the first device).
        let norms: Vec<Tensor> = grads.iter().map(|g| g.norm().to(first.device())).collect();
        let total = Tensor::stack(&norms, 0).norm();
        if max_norm > 0.0 {
            let coef = ((&total + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
            for mut g in grads {
                let _ = g.g_mul_(&coef.to(g.device()));
            }
        }
        Ok(Some(total))
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
