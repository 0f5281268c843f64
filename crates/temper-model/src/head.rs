//! The unembedding, chunk by chunk over tokens: per-token log-probabilities and entropies from
//! final hidden states without ever holding more than one chunk of (tokens, vocabulary) logits,
//! in the forward and in the backward (what Liger's fused linear cross-entropy and Apple's Cut
//! Cross-Entropy do for the same reason: at 1,024 samples x 1,000 tokens x 150k vocabulary the
//! full logits alone are hundreds of GB).
//!
//! Autograd cannot keep one chunk at a time (it would save every chunk's logits for the
//! backward), so a training call is split in two explicit halves:
//!
//! 1. [`CausalLm::score_tokens`] computes `logp` and `entropy` chunk by chunk without a graph and
//!    returns them as leaves that require grad. The caller builds its loss from them and calls
//!    `loss.backward()`, which stops at the leaves and leaves `dloss/dlogp`, `dloss/dentropy`
//!    there.
//! 2. [`TokenScores::backward`] recomputes each chunk's logits with autograd, back-propagates the
//!    leaves' gradients through it (into the unembedding's weights and that chunk of hidden
//!    states), frees it, and finally sends the hidden states' gradient through the decoder.
//!
//! The gradients are exact (the chunk is recomputed by the same kernels on the same inputs), and
//! positions whose upstream gradient is zero (prompts, padding, zero advantages) skip the
//! recompute altogether.
//!
//! When the head is one matmul (no LoRA on it, no sampling copy in place), both halves run a block
//! of the vocabulary at a time as well ([`crate::vocab_blocks`]): no (chunk x vocabulary) logits
//! and no copy of the whole weight in the compute dtype; the token-chunk path below serves the
//! other heads.

use tch::{Kind, Tensor};

use crate::logprobs::{logprobs_and_entropy, logprobs_and_entropy_backward};
use crate::model::CausalLm;
use crate::vocab_blocks::spans;

/// The most tokens per chunk of logits when the config names none.
pub const DEFAULT_UNEMBED_CHUNK: i64 = 1024;

/// Bytes of f32 logits one default chunk may hold: 256 tokens of SmolLM2's 49,152-token
/// vocabulary, 50 MB. The forward holds two such buffers per chunk and the backward two more (and
/// bf16 copies); chunks of 128 to 1,024 tokens measured the same speed within noise
/// (BENCHMARKS.md, "The unembedding's chunk").
const DEFAULT_CHUNK_LOGIT_BYTES: i64 = 256 * 49_152 * 4;

/// Tokens per chunk of logits when the config names none, for a vocabulary of `vocab_size`: as
/// many as keep one chunk's logits within [`DEFAULT_CHUNK_LOGIT_BYTES`], at most
/// [`DEFAULT_UNEMBED_CHUNK`], at least 64. So a larger vocabulary gets shorter chunks, not larger
/// ones (SmolLM2: 256 tokens; Qwen2.5's 151,936 tokens: 82).
pub fn default_unembed_chunk(vocab_size: i64) -> i64 {
    (DEFAULT_CHUNK_LOGIT_BYTES / (vocab_size.max(1) * 4)).clamp(64, DEFAULT_UNEMBED_CHUNK)
}

/// Log-probabilities and entropies of some tokens, with the second half of their backward pending
/// when they were computed with autograd (see the module docs).
pub struct TokenScores<'m> {
    /// log p(target) under softmax(logits / temperature), shaped like the targets, f32.
    pub logp: Tensor,
    /// The entropy of that distribution at each position, shaped like the targets, f32.
    pub entropy: Tensor,
    pending: Option<Pending<'m>>,
    /// Where the backward goes on from the hidden states (activation checkpointing).
    checkpoints: Option<crate::LayerCheckpoints<'m>>,
}

/// What [`TokenScores::backward`] needs to recompute the chunks.
struct Pending<'m> {
    model: &'m CausalLm,
    /// (..., H) with autograd back to the decoder's parameters.
    hidden: Tensor,
    /// (N,) flat targets.
    targets: Tensor,
    temperature: f64,
    chunk: i64,
    /// (N) the log-sum-exp of each position's scaled logits, when the forward ran a block of the
    /// vocabulary at a time ([`crate::vocab_blocks`]); its backward then does too.
    lse: Option<Tensor>,
}

impl CausalLm {
    /// Scores `targets` (any shape `S`, i64) against `hidden` (`S` x H final hidden states, as
    /// [`CausalLm::forward_hidden`] returns them), `chunk` positions at a time.
    ///
    /// Without autograd on `hidden` (under `tch::no_grad`, or a frozen model) the result is plain
    /// tensors. With it, `logp` and `entropy` are leaves: build the loss from them, call
    /// `loss.backward()`, then [`TokenScores::backward`] to reach the model's parameters.
    pub fn score_tokens(
        &self,
        hidden: &Tensor,
        targets: &Tensor,
        temperature: f64,
        chunk: i64,
    ) -> TokenScores<'_> {
        assert!(chunk > 0, "unembedding chunk must be positive, got {chunk}");
        let shape = targets.size();
        let dims = hidden.size();
        assert_eq!(
            &dims[..dims.len() - 1],
            shape.as_slice(),
            "hidden states {dims:?} do not match targets {shape:?}"
        );
        let h = dims[dims.len() - 1];
        let n = targets.numel() as i64;
        let flat_targets = targets.reshape([n]);
        let (logp, entropy, lse) = match self.plain_head_weight() {
            Some(w) => {
                let kind = self.compute().kind();
                let flat = hidden.detach().reshape([n, h]);
                let (logp, entropy, lse) =
                    crate::vocab_blocks::forward(w, kind, &flat, &flat_targets, temperature, chunk);
                let shaped = |t: Tensor| t.reshape(&shape[..]);
                (shaped(logp), shaped(entropy), Some(lse))
            }
            None => tch::no_grad(|| {
                let flat = hidden.reshape([n, h]);
                let head = self.head_in_compute_dtype();
                let (mut lps, mut ents) = (vec![], vec![]);
                for (start, len) in spans(n, chunk) {
                    let logits = self.logits_with_head(&flat.narrow(0, start, len), head.as_ref());
                    let (lp, ent) = logprobs_and_entropy(
                        &logits,
                        &flat_targets.narrow(0, start, len),
                        temperature,
                    );
                    lps.push(lp);
                    ents.push(ent);
                }
                let cat = |v: &[Tensor]| match v.len() {
                    0 => Tensor::zeros(&shape[..], (Kind::Float, hidden.device())),
                    _ => Tensor::cat(v, 0).reshape(&shape[..]),
                };
                (cat(&lps), cat(&ents), None)
            }),
        };
        self.scores(hidden, logp, entropy, flat_targets, temperature, chunk, lse)
    }

    /// The scores as plain tensors without autograd on `hidden`, else as leaves with the second
    /// half of the backward pending.
    #[allow(clippy::too_many_arguments)]
    fn scores(
        &self,
        hidden: &Tensor,
        logp: Tensor,
        entropy: Tensor,
        targets: Tensor,
        temperature: f64,
        chunk: i64,
        lse: Option<Tensor>,
    ) -> TokenScores<'_> {
        if !hidden.requires_grad() {
            return TokenScores {
                logp,
                entropy,
                pending: None,
                checkpoints: None,
            };
        }
        TokenScores {
            logp: logp.detach().requires_grad_(true),
            entropy: entropy.detach().requires_grad_(true),
            pending: Some(Pending {
                model: self,
                hidden: hidden.shallow_clone(),
                targets,
                temperature,
                chunk,
                lse,
            }),
            checkpoints: None,
        }
    }
}

impl<'m> TokenScores<'m> {
    /// `(logp, entropy)`, dropping any pending backward: for callers without autograd (old and
    /// reference log-probs, scoring, checks).
    pub fn into_parts(self) -> (Tensor, Tensor) {
        (self.logp, self.entropy)
    }

    /// Completes the backward that `loss.backward()` started at `logp` and `entropy`: adds the
    /// loss's gradient to every parameter's `.grad` (the unembedding's, then the decoder's).
    /// Nothing happens when the scores were computed without autograd, or when no gradient
    /// reached them (a loss that uses neither, or whose weights are all zero).
    pub fn backward(mut self) {
        let checkpoints = self.checkpoints.take();
        self.backward_to_hidden();
        if let Some(c) = checkpoints {
            c.backward();
        }
    }

    /// The hidden states came from [`CausalLm::forward_hidden_checkpointed`]: [`Self::backward`]
    /// goes on through `checkpoints` into the layers.
    pub fn with_checkpoints(mut self, checkpoints: crate::LayerCheckpoints<'m>) -> Self {
        self.checkpoints = Some(checkpoints);
        self
    }

    fn backward_to_hidden(self) {
        let Some(p) = self.pending else { return };
        let n = p.targets.numel() as i64;
        let upstream = |t: &Tensor| {
            let g = t.grad();
            g.defined().then(|| g.reshape([n]))
        };
        let (g_lp, g_ent) = (upstream(&self.logp), upstream(&self.entropy));
        let live = match (&g_lp, &g_ent) {
            (None, None) => return,
            (Some(a), None) | (None, Some(a)) => a.ne(0.0),
            (Some(a), Some(b)) => a.ne(0.0).logical_or(&b.ne(0.0)),
        };
        // Only positions with a gradient are recomputed: their index, in order.
        let live = live.nonzero().squeeze_dim(1);
        let k = live.size()[0];
        if k == 0 {
            return;
        }
        let dims = p.hidden.size();
        let h = dims[dims.len() - 1];
        let flat = p.hidden.detach().reshape([n, h]);
        let grad_hidden = flat.zeros_like();
        if let (Some(lse), Some(w)) = (&p.lse, p.model.plain_head_weight()) {
            let w_grad = w.requires_grad().then(|| dense_grad(w));
            let pick = |t: &Tensor| t.reshape([n]).index_select(0, &live);
            let pick_opt = |g: &Option<Tensor>| g.as_ref().map(|g| g.index_select(0, &live));
            let (g_lp, g_ent) = (pick_opt(&g_lp), pick_opt(&g_ent));
            let (x, targets) = (
                flat.index_select(0, &live),
                p.targets.index_select(0, &live),
            );
            let (lse, entropy) = (pick(lse), pick(&self.entropy.detach()));
            let grad_rows = crate::vocab_blocks::backward(
                w,
                w_grad.as_ref(),
                p.model.compute().kind(),
                crate::vocab_blocks::LivePositions {
                    hidden: &x,
                    targets: &targets,
                    lse: &lse,
                    entropy: &entropy,
                    g_logp: g_lp.as_ref(),
                    g_entropy: g_ent.as_ref(),
                },
                p.temperature,
                p.chunk,
            );
            let _ =
                grad_hidden
                    .shallow_clone()
                    .index_copy_(0, &live, &grad_rows.to_kind(flat.kind()));
        } else {
            p.backward_lora_head(&flat, &live, g_lp, g_ent, &grad_hidden);
        }
        // d(sum(hidden * g))/d(hidden) = g exactly: the decoder receives the gradient unchanged.
        (p.hidden * grad_hidden.view(&dims[..]))
            .sum(Kind::Float)
            .backward();
    }
}

impl Pending<'_> {
    /// The token-chunk backward of a head the blocks do not serve (LoRA on it): writes the live
    /// positions' hidden-state gradient into `grad_hidden` (N, H).
    fn backward_lora_head(
        &self,
        flat: &Tensor,
        live: &Tensor,
        g_lp: Option<Tensor>,
        g_ent: Option<Tensor>,
        grad_hidden: &Tensor,
    ) {
        let k = live.size()[0];
        for (start, len) in spans(k, self.chunk) {
            let idx = live.narrow(0, start, len);
            let targets = self.targets.index_select(0, &idx);
            let upstream = |g: &Option<Tensor>| g.as_ref().map(|g| g.index_select(0, &idx));
            let (g_lp, g_ent) = (upstream(&g_lp), upstream(&g_ent));
            let scores_backward = |logits: Tensor| {
                logprobs_and_entropy_backward(
                    logits,
                    &targets,
                    self.temperature,
                    g_lp.as_ref(),
                    g_ent.as_ref(),
                )
            };
            // A LoRA'd head: autograd from the logits on (the adapter's gradients), with the
            // logits' gradient in closed form.
            let rows = flat.index_select(0, &idx).requires_grad_(true);
            let logits = self.model.logits(&rows);
            let grad_logits = tch::no_grad(|| scores_backward(logits.detach().copy()));
            (logits * grad_logits).sum(Kind::Float).backward();
            let grad_rows = rows.grad();
            let _ =
                grad_hidden
                    .shallow_clone()
                    .index_copy_(0, &idx, &grad_rows.to_kind(flat.kind()));
        }
    }
}

/// `w`'s gradient, made a zeros tensor first if it has none, which the blocked backward then adds
/// into in place. (Fails only where libtorch cannot allocate, where tch's own `backward` panics
/// too.)
fn dense_grad(w: &Tensor) -> Tensor {
    temper_kernels::zero_grad_if_missing(w).expect("allocating the head weight's gradient");
    w.grad()
}

#[cfg(test)]
mod tests {
    use super::default_unembed_chunk;

    #[test]
    fn the_default_chunk_keeps_a_chunks_logits_within_256_smollm2_tokens() {
        // SmolLM2 gets 256; larger vocabularies get shorter chunks of the same bytes; a tiny
        // vocabulary is capped at 1,024 and a huge one floored at 64.
        assert_eq!(default_unembed_chunk(49_152), 256);
        assert_eq!(default_unembed_chunk(151_936), 82);
        assert_eq!(default_unembed_chunk(128_256), 98);
        assert_eq!(default_unembed_chunk(260), 1024);
        assert_eq!(default_unembed_chunk(10_000_000), 64);
    }
}
