//! The unembedding a block of the vocabulary at a time (Cut Cross-Entropy's loop order: vocabulary
//! blocks outside, token chunks inside), for a head that is one matmul: no (tokens x vocabulary)
//! buffer and no copy of the whole weight in the compute dtype ever exist, only a (chunk x block)
//! slice of logits and one block of the weight. The forward keeps an online log-sum-exp per token
//! (running max, sum of exponentials, and their sum weighted by the logit, for the entropy); the
//! backward recomputes each (chunk, block) of logits, forms its gradient from the forward's
//! log-sum-exp and entropy, adds the block's weight gradient into `.grad` in place and the hidden
//! states' gradient into an f32 sum over the blocks.
//!
//! The logits are the same numbers as the whole matmul's (each is one dot product over the hidden
//! size); the reductions over the vocabulary run in another order, so log-probs and entropies
//! agree with [`crate::logprobs_and_entropy`] over full logits to float rounding (tested at 1e-6).
//! In bf16 the weight gradient is the bf16 product added into the f32 `.grad`, as autograd's cast
//! back does, and the hidden states' gradient is summed in f32 over the blocks, then rounded to
//! bf16 once (autograd's bf16 matmul rounds its single f32 sum the same way).

use tch::{Kind, Tensor};

/// Vocabulary rows per block: SmolLM2's 49,152 in 24, Qwen2.5's 151,936 in 75. A block's f32
/// logits for 256 tokens are 2 MiB; its weight-side temporaries in bf16 (the block, its f32 copy,
/// the weight gradient's bf16 product and its f32 sum) 12 bytes per row and hidden unit: 14 MiB
/// for SmolLM2, where blocks of 8,192 rows held 57 MiB at the peak, as much as the bf16 copy of
/// the whole weight they replace.
pub const VOCAB_BLOCK: i64 = 2048;

/// `(start, len)` of consecutive spans of at most `chunk` covering `0..n`, of near-equal lengths:
/// a remainder of a few rows would take libtorch's small-matrix path, whose f32 sums over the
/// vocabulary are ordered differently from the large-matrix one (1e-4 relative apart on a 49k
/// vocabulary; chunks of a few rows or more agree with the unchunked product).
pub(crate) fn spans(n: i64, chunk: i64) -> impl Iterator<Item = (i64, i64)> {
    let parts = if n == 0 {
        0
    } else {
        (n + chunk - 1) / chunk.max(1)
    };
    (0..parts).map(move |i| {
        let start = i * n / parts;
        (start, (i + 1) * n / parts - start)
    })
}

/// One block of the weight in the compute dtype (`kind`): a view in f32, a copy otherwise.
fn block_of(w: &Tensor, start: i64, len: i64, kind: Kind) -> Tensor {
    w.narrow(0, start, len).to_kind(kind)
}

/// f32 logits of `x` (rows in the compute dtype) against `wb`, divided by the temperature.
fn scaled_logits(x: &Tensor, wb: &Tensor, temperature: f64) -> Tensor {
    let z = x.linear(wb, None::<&Tensor>).to_kind(Kind::Float);
    if temperature == 1.0 {
        z
    } else {
        z / temperature
    }
}

/// Per-token `(logp, entropy, lse)` of `targets` (N) under softmax(x W^T / T), for hidden states
/// `flat` (N, H), `chunk` tokens at a time; `lse` is the log-sum-exp of the scaled logits, which
/// [`backward`] needs. No autograd.
pub(crate) fn forward(
    w: &Tensor,
    kind: Kind,
    flat: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk: i64,
) -> (Tensor, Tensor, Tensor) {
    tch::no_grad(|| {
        let n = flat.size()[0];
        let opts = (Kind::Float, flat.device());
        let x = flat.to_kind(kind);
        let max = Tensor::full([n], f64::NEG_INFINITY, opts);
        let sum = Tensor::zeros([n], opts);
        let weighted = Tensor::zeros([n], opts);
        let picked = Tensor::zeros([n], opts);
        let vocab = w.size()[0];
        // A target outside the vocabulary would match no block and score -lse silently (the
        // whole-row gather this replaces failed on it).
        if n > 0 {
            let (lo, hi) = (
                targets.min().int64_value(&[]),
                targets.max().int64_value(&[]),
            );
            assert!(
                lo >= 0 && hi < vocab,
                "target token ids must be in 0..{vocab}, got {lo}..={hi}"
            );
        }
        for (b0, bl) in spans(vocab, VOCAB_BLOCK) {
            let wb = block_of(w, b0, bl, kind);
            for (c0, cl) in spans(n, chunk) {
                let z = scaled_logits(&x.narrow(0, c0, cl), &wb, temperature);
                let rows = |t: &Tensor| t.narrow(0, c0, cl);
                let (mut m, mut s, mut t) = (rows(&max), rows(&sum), rows(&weighted));
                // The target's logit, where the target falls in this block.
                let (here, local) = targets_in_block(&rows(targets), b0, bl);
                let z_tgt = z.gather(1, &local, false).squeeze_dim(1);
                rows(&picked).copy_(&z_tgt.where_self(&here, &rows(&picked)));
                // Online log-sum-exp: rescale the sums to the new running max.
                let m_new = m.maximum(&z.amax([1i64].as_slice(), false));
                let rescale = (&m - &m_new).exp();
                let mut e = (&z - m_new.unsqueeze(1)).exp_();
                let _ = s.g_mul_(&rescale).g_add_(&row_sum(&e));
                let _ = t.g_mul_(&rescale).g_add_(&row_sum(&e.g_mul_(&z)));
                m.copy_(&m_new);
            }
        }
        let lse = &max + sum.log();
        let logp = &picked - &lse;
        let entropy = &lse - weighted / &sum;
        (logp, entropy, lse)
    })
}

/// Which of `targets` (N) fall in the block of rows `b0..b0 + bl` (bool, N), and their column in
/// it, (N, 1) for `gather`/`scatter_add_` (clamped into the block where they do not fall in it).
fn targets_in_block(targets: &Tensor, b0: i64, bl: i64) -> (Tensor, Tensor) {
    let here = targets.ge(b0).logical_and(&targets.lt(b0 + bl));
    let local = (targets - b0).clamp(0, bl - 1).unsqueeze(1);
    (here, local)
}

/// The vocabulary columns one token's logits occupy at a time: a block of them where the head
/// runs a block at a time (no LoRA on it: [`forward`]), the whole vocabulary otherwise.
pub fn logit_columns(vocab_size: i64, lora_on_head: bool) -> i64 {
    if lora_on_head {
        vocab_size
    } else {
        vocab_size.min(VOCAB_BLOCK)
    }
}

/// Sums over the last dimension of a (rows, cols) f32 tensor.
fn row_sum(t: &Tensor) -> Tensor {
    t.sum_dim_intlist([1i64].as_slice(), false, Kind::Float)
}

/// What [`backward`] needs of the positions whose loss gradient is not zero (K of them).
pub(crate) struct LivePositions<'a> {
    /// (K, H) final hidden states.
    pub hidden: &'a Tensor,
    /// (K) target token ids.
    pub targets: &'a Tensor,
    /// (K) the forward's log-sum-exp and entropy.
    pub lse: &'a Tensor,
    pub entropy: &'a Tensor,
    /// (K) upstream gradients of logp and entropy (absent: zero).
    pub g_logp: Option<&'a Tensor>,
    pub g_entropy: Option<&'a Tensor>,
}

/// The backward of [`forward`] for the live positions: adds the weight's gradient into `w_grad`
/// (f32, shaped like `w`; `None` for a frozen head) in place and returns the hidden states'
/// gradient, (K, H) f32. Per (chunk, block) of logits `z` (scaled):
/// `d logp / dz_j = [j = target] - p_j`, `dH / dz_j = -p_j (log p_j + H)`, `p_j = exp(z_j - lse)`,
/// then divided by T for the logits (what `logprobs_and_entropy_backward` computes over a whole
/// row).
pub(crate) fn backward(
    w: &Tensor,
    w_grad: Option<&Tensor>,
    kind: Kind,
    live: LivePositions<'_>,
    temperature: f64,
    chunk: i64,
) -> Tensor {
    tch::no_grad(|| {
        let k = live.targets.size()[0];
        let x = live.hidden.to_kind(kind);
        let column = |t: &Tensor| t.to_kind(Kind::Float).unsqueeze(1);
        let grad_x = Tensor::zeros([k, w.size()[1]], (Kind::Float, w.device()));
        let vocab = w.size()[0];
        for (b0, bl) in spans(vocab, VOCAB_BLOCK) {
            let wb = block_of(w, b0, bl, kind);
            // The block's weights as f32 values (bf16-rounded in bf16) for the f32 sum of the
            // hidden states' gradient.
            let wb_f32 = wb.to_kind(Kind::Float);
            for (c0, cl) in spans(k, chunk) {
                let rows = |t: &Tensor| t.narrow(0, c0, cl);
                let xc = rows(&x);
                let z = scaled_logits(&xc, &wb, temperature);
                let mut log_p = z - column(&rows(live.lse));
                let mut p = log_p.exp();
                // `a` becomes p_j * (g_logp + g_entropy * (log p_j + H)).
                let mut a = match (live.g_logp, live.g_entropy) {
                    (g_lp, Some(g_ent)) => {
                        let _ = log_p
                            .g_add_(&column(&rows(live.entropy)))
                            .g_mul_(&column(&rows(g_ent)));
                        if let Some(g_lp) = g_lp {
                            let _ = log_p.g_add_(&column(&rows(g_lp)));
                        }
                        log_p.g_mul_(&p)
                    }
                    (Some(g_lp), None) => p * column(&rows(g_lp)),
                    (None, None) => p.zero_(),
                };
                let _ = a.neg_();
                if let Some(g_lp) = live.g_logp {
                    let (here, local) = targets_in_block(&rows(live.targets), b0, bl);
                    let add = column(&(rows(g_lp) * here.to_kind(Kind::Float)));
                    let _ = a.scatter_add_(1, &local, &add);
                }
                if temperature != 1.0 {
                    let _ = a.g_div_scalar_(temperature);
                }
                let g = a.to_kind(kind);
                if let Some(w_grad) = w_grad {
                    let w_rows = w_grad.narrow(0, b0, bl);
                    if kind == w_grad.kind() {
                        let _ = w_rows.shallow_clone().addmm_(&g.tr(), &xc);
                    } else {
                        let _ = w_rows.shallow_clone().g_add_(&g.tr().mm(&xc));
                    }
                }
                let _ = rows(&grad_x).addmm_(&g.to_kind(Kind::Float), &wb_f32);
            }
        }
        if kind == Kind::Float {
            grad_x
        } else {
            grad_x.to_kind(kind).to_kind(Kind::Float)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::spans;

    #[test]
    fn spans_cover_everything_in_near_equal_parts() {
        for (n, chunk) in [(0, 4), (1, 4), (1025, 1024), (27, 8), (10, 3), (7, 100)] {
            let s: Vec<_> = spans(n, chunk).collect();
            assert_eq!(s.iter().map(|x| x.1).sum::<i64>(), n);
            assert!(s.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
            assert!(s.iter().all(|x| x.1 <= chunk && x.1 >= 1));
            let (lo, hi) = (s.iter().map(|x| x.1).min(), s.iter().map(|x| x.1).max());
            assert!(hi.zip(lo).is_none_or(|(h, l)| h - l <= 1), "{s:?}");
        }
        assert_eq!(
            spans(1025, 1024).collect::<Vec<_>>(),
            [(0, 512), (512, 513)]
        );
    }
}
