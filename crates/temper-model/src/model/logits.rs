//! The unembedding: logits from hidden states (the tied or untied head, with its LoRA adapter),
//! in the compute dtype, and the chunk size the log-prob passes use.
use tch::{Kind, Tensor};

use super::CausalLm;

impl CausalLm {
    /// Logits (..., V) in f32 from final hidden states (e.g. only the last position when sampling).
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        self.logits_with_head(hidden, None)
    }

    /// The unembedding's weight cast to the compute dtype once, for [`CausalLm::logits_with_head`]
    /// over many chunks without autograd: `None` in f32 (the weight itself is used) or when a
    /// sampling copy is in place. Casting Qwen2.5's (151,936 x 896) head to bf16 takes longer
    /// than a chunk's matmul (190 against 138 ms on 2 cores), so it is not done per chunk.
    pub(crate) fn head_in_compute_dtype(&self) -> Option<Tensor> {
        let kind = self.compute.kind();
        if kind == Kind::Float || self.sampling.borrow().is_some() {
            return None;
        }
        let w = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        Some(tch::no_grad(|| w.to_kind(kind)))
    }

    /// [`CausalLm::logits`] with the unembedding's weight already in the compute dtype
    /// ([`CausalLm::head_in_compute_dtype`]); `None` casts it here.
    pub(crate) fn logits_with_head(&self, hidden: &Tensor, head: Option<&Tensor>) -> Tensor {
        let kind = self.compute.kind();
        let x = hidden.to_kind(kind);
        if let Some(s) = self.sampling.borrow().as_ref() {
            return s.head.forward(&x).to_kind(Kind::Float);
        }
        let w = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        // `linear`, not `matmul(w.tr())`: the latter's backward was ~25% slower here.
        let logits = match head {
            Some(wk) => x.linear(wk, None::<&Tensor>),
            None if kind == Kind::Float => x.linear(w, None::<&Tensor>),
            None => x.linear(&w.to_kind(kind), None::<&Tensor>),
        };
        let logits = match crate::lora::active(&self.head_lora) {
            Some(l) => logits + l.forward(&x, kind),
            None => logits,
        };
        logits.to_kind(Kind::Float)
    }

    /// The unembedding's (f32) weight when [`CausalLm::logits`] is that one matmul: no LoRA on the
    /// head and no sampling copy in place ([`crate::vocab_blocks`] computes it a block at a time).
    pub(crate) fn plain_head_weight(&self) -> Option<&Tensor> {
        if crate::lora::active(&self.head_lora).is_some() || self.sampling.borrow().is_some() {
            return None;
        }
        Some(self.lm_head.as_ref().unwrap_or(&self.embed_tokens))
    }

    /// Tokens per chunk of logits when the config names none: [`crate::default_unembed_chunk`] of
    /// the vocabulary columns a chunk holds, a block of them where the head runs a block at a
    /// time ([`crate::vocab_blocks`]: 1,024 tokens), the whole vocabulary otherwise (LoRA on the
    /// head, or sampling: 256 tokens for SmolLM2, 82 for Qwen2.5).
    pub fn default_unembed_chunk(&self) -> i64 {
        let columns = crate::vocab_blocks::logit_columns(
            self.config.vocab_size,
            self.plain_head_weight().is_none(),
        );
        crate::head::default_unembed_chunk(columns)
    }

    /// Per-token log-probabilities of `targets` (B, T) under softmax(logits / temperature), and the
    /// entropy of that distribution, both (B, T) f32, the unembedding computed
    /// [`CausalLm::default_unembed_chunk`] positions at a time ([`CausalLm::score_tokens`]; with
    /// autograd, finish a `loss.backward()` with [`crate::TokenScores::backward`]). Usually
    /// `targets` is `input_ids` shifted left by one (the caller masks the last position and
    /// padding).
    pub fn token_logprobs(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        position_ids: &Tensor,
        targets: &Tensor,
        temperature: f64,
    ) -> crate::TokenScores<'_> {
        let hidden = self.forward_hidden(input_ids, position_ids, attention_mask, None);
        self.score_tokens(&hidden, targets, temperature, self.default_unembed_chunk())
    }
}
