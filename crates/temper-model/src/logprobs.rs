//! Log-probabilities of chosen tokens and entropy, from logits, without materialising a second
//! (B, T, V) log-softmax: `logp = z[target] - logsumexp(z)`, `H = logsumexp(z) - sum(softmax(z) * z)`
//! with `z = logits / temperature` (what verl computes).

use tch::{Kind, Tensor};

/// `(logp, entropy)`, each shaped like `targets`, f32, differentiable w.r.t. `logits`.
///
/// `logits`: (..., V); `targets`: (...) i64 indices into V.
pub fn logprobs_and_entropy(
    logits: &Tensor,
    targets: &Tensor,
    temperature: f64,
) -> (Tensor, Tensor) {
    let z = scaled_logits(logits, temperature);
    let lse = z.logsumexp([-1], false);
    let picked = z.gather(-1, &targets.unsqueeze(-1), false).squeeze_dim(-1);
    let logp = picked - &lse;
    let entropy = &lse
        - (z.softmax(-1, Kind::Float) * &z).sum_dim_intlist([-1i64].as_slice(), false, Kind::Float);
    (logp, entropy)
}

/// f32 logits divided by the temperature (left untouched at 1, so T = 1 is bitwise the raw logits).
fn scaled_logits(logits: &Tensor, temperature: f64) -> Tensor {
    assert!(
        temperature > 0.0,
        "temperature must be positive, got {temperature}"
    );
    let logits = logits.to_kind(Kind::Float);
    if temperature == 1.0 {
        logits
    } else {
        logits / temperature
    }
}

/// Log-probabilities only (no entropy work).
pub fn logprobs_of(logits: &Tensor, targets: &Tensor, temperature: f64) -> Tensor {
    let z = scaled_logits(logits, temperature);
    let lse = z.logsumexp([-1], false);
    z.gather(-1, &targets.unsqueeze(-1), false).squeeze_dim(-1) - lse
}
