//! Entropy of the policy from its logits (verl's `entropy_from_logits`).

use tch::{Kind, Tensor};

/// `H = logsumexp(z) - sum_v softmax(z)_v z_v` over the last dim: `(..., V)` -> `(...)`.
pub fn entropy_from_logits(logits: &Tensor) -> Tensor {
    let p = logits.softmax(-1, None::<Kind>);
    logits.logsumexp(-1, false) - (p * logits).sum_dim_intlist(-1, false, None::<Kind>)
}
