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
    let mut p = z.softmax(-1, Kind::Float);
    // Without autograd the product reuses the softmax's buffer: one (..., V) buffer fewer.
    let pz = if p.requires_grad() {
        p * &z
    } else {
        p.g_mul_(&z)
    };
    let entropy = &lse - pz.sum_dim_intlist([-1i64].as_slice(), false, Kind::Float);
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

/// The gradient of `sum(g_logp * logp) + sum(g_entropy * entropy)` with respect to `logits`
/// (N, V), for [`logprobs_and_entropy`]'s `(logp, entropy)` of `targets` (N): what autograd
/// returns through that function, in two (N, V) f32 buffers instead of autograd's five or six
/// (the chunked head's backward holds one chunk of these; see `head.rs`). With `z = logits / T`,
/// `p = softmax(z)` and `H` the entropy:
/// `d logp / dz_j = [j = target] - p_j`, `dH / dz_j = -p_j (log p_j + H)`, and `d/dlogits = d/dz / T`.
///
/// `logits` is consumed: its buffer is reused when it is already f32 at T = 1. An absent upstream
/// gradient counts as zero. `g_logp` and `g_entropy` are (N) f32.
pub fn logprobs_and_entropy_backward(
    logits: Tensor,
    targets: &Tensor,
    temperature: f64,
    g_logp: Option<&Tensor>,
    g_entropy: Option<&Tensor>,
) -> Tensor {
    let n = targets.numel() as i64;
    let column = |g: &Tensor| g.to_kind(Kind::Float).reshape([n, 1]);
    let mut log_p = scaled_logits(&logits, temperature);
    drop(logits);
    let lse = log_p.logsumexp([-1], true);
    let _ = log_p.g_sub_(&lse);
    let mut p = log_p.exp();
    // `a` becomes p_j * (g_logp + g_entropy * (log p_j + H)), reusing log p's buffer.
    let mut a = match g_entropy {
        Some(g_ent) => {
            let h = entropy_of(&p, &log_p);
            let _ = log_p.g_add_(&h).g_mul_(&column(g_ent));
            if let Some(g_lp) = g_logp {
                let _ = log_p.g_add_(&column(g_lp));
            }
            log_p.g_mul_(&p)
        }
        None => {
            drop(log_p);
            match g_logp {
                Some(g_lp) => p.g_mul_(&column(g_lp)),
                None => p.zero_(),
            }
        }
    };
    let _ = a.neg_();
    if let Some(g_lp) = g_logp {
        let _ = a.scatter_add_(1, &targets.reshape([n, 1]), &column(g_lp));
    }
    if temperature != 1.0 {
        let _ = a.g_div_scalar_(temperature);
    }
    a
}

/// Vocabulary columns per slice of [`entropy_of`]'s products.
const ENTROPY_SLICE: i64 = 8192;

/// `-sum_j p_j log p_j` per row, (N, 1), a slice of the vocabulary at a time: a whole (N, V)
/// product would be a third buffer, and a row-wise matmul sums in f32 sequentially (1e-4 off on a
/// 49k vocabulary, where libtorch's `sum` is within 1e-6).
fn entropy_of(p: &Tensor, log_p: &Tensor) -> Tensor {
    let v = p.size()[1];
    let mut h = Tensor::zeros([p.size()[0], 1], (Kind::Float, p.device()));
    let mut start = 0;
    while start < v {
        let len = ENTROPY_SLICE.min(v - start);
        let part = p.narrow(1, start, len) * log_p.narrow(1, start, len);
        h -= part.sum_dim_intlist([1i64].as_slice(), true, Kind::Float);
        start += len;
    }
    h
}

/// Log-probabilities only (no entropy work).
pub fn logprobs_of(logits: &Tensor, targets: &Tensor, temperature: f64) -> Tensor {
    let z = scaled_logits(logits, temperature);
    let lse = z.logsumexp([-1], false);
    z.gather(-1, &targets.unsqueeze(-1), false).squeeze_dim(-1) - lse
}

#[cfg(test)]
mod tests {
    use super::{logprobs_and_entropy, logprobs_and_entropy_backward};
    use tch::{Device, Kind, Tensor};

    /// Against libtorch's autograd through [`logprobs_and_entropy`]: f32 and bf16 logits, two
    /// temperatures, either upstream gradient absent, and rows whose upstream gradient is zero.
    #[test]
    fn backward_equals_autograd() {
        tch::manual_seed(5);
        let (n, v) = (7, 50);
        let targets = Tensor::randint(v, [n], (Kind::Int64, Device::Cpu));
        let g_lp = Tensor::randn([n], (Kind::Float, Device::Cpu));
        let g_ent = Tensor::randn([n], (Kind::Float, Device::Cpu)) * 0.3;
        let _ = g_lp.narrow(0, 2, 2).zero_();
        for kind in [Kind::Float, Kind::BFloat16] {
            let logits = (Tensor::randn([n, v], (Kind::Float, Device::Cpu)) * 3.0).to_kind(kind);
            for temperature in [1.0, 0.7] {
                for (lp, ent) in [
                    (Some(&g_lp), Some(&g_ent)),
                    (Some(&g_lp), None),
                    (None, Some(&g_ent)),
                ] {
                    // The reference differentiates the same values in f32 (a bf16 leaf would
                    // round its gradient to bf16; the head rounds it where autograd does).
                    let leaf = logits.to_kind(Kind::Float).detach().requires_grad_(true);
                    let (logp, entropy) = logprobs_and_entropy(&leaf, &targets, temperature);
                    let terms = [(&logp, lp), (&entropy, ent)];
                    let loss = terms
                        .iter()
                        .filter_map(|(v, g)| g.map(|g| (*v * g).sum(Kind::Float)))
                        .reduce(|a, b| a + b)
                        .expect("one upstream gradient");
                    loss.backward();
                    let want = leaf.grad();
                    let got = logprobs_and_entropy_backward(
                        logits.copy(),
                        &targets,
                        temperature,
                        lp,
                        ent,
                    );
                    let err = (&got - &want).abs().max().double_value(&[]);
                    let scale = want.abs().max().double_value(&[]);
                    assert!(scale > 0.1, "the reference gradient is all but zero");
                    assert!(
                        err <= 1e-6 * scale.max(1.0),
                        "{kind:?} T={temperature} logp={} entropy={}: max error {err:e}",
                        lp.is_some(),
                        ent.is_some()
                    );
                }
            }
        }
    }
}
