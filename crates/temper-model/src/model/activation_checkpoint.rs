//! Activation checkpointing per decoder layer (verl's `enable_gradient_checkpointing`, temper's
//! `actor.gradient_checkpointing`): the forward keeps only each layer's input, and the backward
//! runs each layer again from it, last to first, with autograd, so that one layer's activations
//! exist at a time instead of all of them. The recomputed forward is the same computation, so the
//! gradients equal the plain backward's to float rounding (the order in which a parameter's
//! contributions add up). With shared prefixes ([`crate::shared_prefix`]) each layer's prompt
//! and response parts are run again together, the responses attending to their prompt's keys.
//! A child of `model` so that it reads the layers directly.

use tch::{Kind, Tensor};

use super::{rms_norm, CausalLm, LayerContext, Mask};
use crate::shared_prefix::{PastGather, SharedPrefixRows};

/// What every layer of a forward over whole sequences uses besides its input: built once by the
/// checkpointed forward, used again by every layer of the backward.
struct Tables {
    b: i64,
    t: i64,
    cos: Tensor,
    sin: Tensor,
    /// The 4-D attention mask over the earlier positions (the prompt's, for responses) and the
    /// rows' own.
    mask: Tensor,
}

impl Tables {
    fn context(&self) -> LayerContext<'_> {
        LayerContext {
            b: self.b,
            t: self.t,
            cos: &self.cos,
            sin: &self.sin,
            mask: &self.mask,
            decode_bias: None,
            cached_attention: false,
            fixed: None,
        }
    }
}

/// One forward over token rows whose layers were checkpointed.
pub(crate) struct Segment {
    input_ids: Tensor,
    tables: Tables,
    /// Each layer's input (the residual stream before it), detached.
    inputs: Vec<Tensor>,
    /// The last layer's output, a leaf the final norm was computed from.
    pub(crate) last: Tensor,
}

/// The layer inputs a checkpointed forward kept, and the backward through them.
pub struct LayerCheckpoints<'m> {
    model: &'m CausalLm,
    prompts: Segment,
    /// Shared prefixes: the responses (without their last token), and where each one's prompt
    /// keys and values are among the prompts'.
    responses: Option<(Segment, PastGather)>,
}

impl<'m> LayerCheckpoints<'m> {
    /// The checkpoints of a forward over `prompts`, then (shared prefixes) `responses`.
    pub(crate) fn new(
        model: &'m CausalLm,
        prompts: Segment,
        responses: Option<(Segment, PastGather)>,
    ) -> Self {
        LayerCheckpoints {
            model,
            prompts,
            responses,
        }
    }
}

impl CausalLm {
    /// [`CausalLm::forward_hidden`] without a cache, keeping only each layer's input: the final
    /// hidden states (with autograd through the final norm only) and the checkpoints that
    /// [`crate::TokenScores::with_checkpoints`] takes the backward on through.
    pub fn forward_hidden_checkpointed(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> (Tensor, LayerCheckpoints<'_>) {
        let (segment, _) = self.checkpointed(
            input_ids,
            position_ids,
            Mask::Padding(attention_mask),
            None,
            false,
        );
        let hidden = rms_norm(&segment.last, &self.norm, self.config.rms_norm_eps);
        let checkpoints = LayerCheckpoints {
            model: self,
            prompts: segment,
            responses: None,
        };
        (hidden, checkpoints)
    }

    /// [`CausalLm::response_hidden_shared`] with checkpointed layers.
    pub fn response_hidden_shared_checkpointed(
        &self,
        rows: &SharedPrefixRows<'_>,
    ) -> (Tensor, LayerCheckpoints<'_>) {
        let (prompts, kv) = self.checkpointed(
            rows.prompt_ids,
            rows.prompt_positions,
            Mask::Padding(rows.prompt_mask),
            None,
            true,
        );
        let p = rows.prompt_ids.size()[1];
        let r = rows.response_ids.size()[1];
        let eps = self.config.rms_norm_eps;
        // The last prompt position predicts the first response token.
        let last = rows.to_rows(&rms_norm(&prompts.last, &self.norm, eps).narrow(1, p - 1, 1));
        let (hidden, responses) = if r > 1 {
            let (past, mask) = rows.response_context(&kv);
            let (segment, _) = self.checkpointed(
                &rows.response_ids.narrow(1, 0, r - 1),
                &rows.response_positions.narrow(1, 0, r - 1),
                Mask::Padding(&mask),
                Some(&past),
                false,
            );
            let response_hidden = rms_norm(&segment.last, &self.norm, eps);
            let hidden = Tensor::cat(&[last, response_hidden], 1);
            let owner = PastGather::Rows(rows.prompt_of_row.shallow_clone());
            (hidden, Some((segment, owner)))
        } else {
            self.sweep_layers_without_compute();
            (last, None)
        };
        let checkpoints = LayerCheckpoints {
            model: self,
            prompts,
            responses,
        };
        (hidden, checkpoints)
    }

    /// The layers over `input_ids` without autograd, keeping each layer's input (and, with
    /// `collect`, each layer's keys and values), attending to `past` keys and values when given.
    pub(crate) fn checkpointed(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        mask: Mask<'_>,
        past: Option<&[(Tensor, Tensor)]>,
        collect: bool,
    ) -> (Segment, Vec<(Tensor, Tensor)>) {
        let past_len = past.and_then(|p| p.first()).map_or(0, |(k, _)| k.size()[2]);
        let tables = self.tables(position_ids, mask, past_len);
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut collected = vec![];
        let last = tch::no_grad(|| {
            let ctx = tables.context();
            let mut h = self.embed(input_ids, false);
            for i in 0..self.layers.len() {
                inputs.push(h.shallow_clone());
                let kv = past.map(|p| &p[i]);
                let into = collect.then_some(&mut collected);
                self.fetch_layer(i);
                h = self.layer(i, h, &ctx, None, None, kv, into);
                self.release_layer_after_forward(i);
            }
            h
        })
        .set_requires_grad(true);
        let segment = Segment {
            input_ids: input_ids.shallow_clone(),
            tables,
            inputs,
            last,
        };
        (segment, collected)
    }

    /// The tables of a forward without a cache over the `position_ids`' (B, T) new tokens after
    /// `past` earlier ones.
    fn tables(&self, position_ids: &Tensor, mask: Mask<'_>, past: i64) -> Tables {
        let (b, t) = position_ids.size2().expect("position_ids must be (B, T)");
        let (cos, sin) = self.rope.cos_sin(position_ids, self.compute.kind());
        Tables {
            b,
            t,
            cos,
            sin,
            mask: mask.to_4d(b, t, past),
        }
    }
}

/// `d sum(y * g) / dy = g` exactly: a surrogate whose backward hands `g` to `y`'s graph.
fn surrogate(y: &Tensor, g: &Tensor) -> Tensor {
    (y * g).sum(Kind::Float)
}

/// The gradient a leaf received, zeros where none did.
fn grad_of(leaf: &Tensor) -> Tensor {
    let g = leaf.grad();
    if g.defined() {
        g
    } else {
        leaf.zeros_like()
    }
}

impl LayerCheckpoints<'_> {
    /// Once the loss's backward has reached the final hidden states: each layer, last to first,
    /// runs again from its kept input (prompts and responses together, the responses attending
    /// to their prompt's recomputed keys and values) with autograd, adds to its parameters'
    /// `.grad` and passes the gradient of its input down; the embedding last. Nothing happens
    /// when no gradient reached the hidden states.
    // `a = a + b`, not `a += b`: tch's `+=` is in place on a tensor autograd may have saved.
    #[allow(clippy::assign_op_pattern)]
    pub fn backward(self) {
        let m = self.model;
        let reached = |s: &Segment| s.last.grad().defined();
        if !reached(&self.prompts) && !self.responses.as_ref().is_some_and(|(s, _)| reached(s)) {
            m.sweep_backward_without_compute();
            return;
        }
        let mut g_prompts = grad_of(&self.prompts.last);
        let mut g_responses = self.responses.as_ref().map(|(s, _)| grad_of(&s.last));
        let p = &self.prompts;
        let ctx_p = p.tables.context();
        let ctx_s = self.responses.as_ref().map(|(s, _)| s.tables.context());
        for i in (0..p.inputs.len()).rev() {
            if m.trims_heap_in_backward() {
                // The layer above's recomputed activations are freed, its gradients allocated.
                temper_kernels::memory::release_free_memory_if_grown();
            }
            let xp = p.inputs[i].detach().set_requires_grad(true);
            m.fetch_layer(i);
            let (Some((s, owner)), Some(ctx_s)) = (&self.responses, &ctx_s) else {
                let yp = m.layer(i, xp.shallow_clone(), &ctx_p, None, None, None, None);
                surrogate(&yp, &g_prompts).backward();
                g_prompts = xp.grad();
                m.layer_backward_done(i);
                continue;
            };
            let mut kv = vec![];
            let yp = m.layer(
                i,
                xp.shallow_clone(),
                &ctx_p,
                None,
                None,
                None,
                Some(&mut kv),
            );
            let (k, v) = kv.pop().expect("the layer's keys and values");
            let past = (owner.gather(&k), owner.gather(&v));
            let xs = s.inputs[i].detach().set_requires_grad(true);
            let g_s = g_responses.as_ref().expect("responses have a gradient");
            let ys = m.layer(i, xs.shallow_clone(), ctx_s, None, None, Some(&past), None);
            (surrogate(&yp, &g_prompts) + surrogate(&ys, g_s)).backward();
            g_prompts = xp.grad();
            g_responses = Some(xs.grad());
            m.layer_backward_done(i);
        }
        if !m.embed_tokens.requires_grad() {
            return;
        }
        let grad = m.embed_tokens.grad();
        if grad.defined() {
            // Added row by row in place: autograd's embedding backward would first build a
            // vocabulary-sized dense gradient per call (2 x 113 MB for SmolLM2).
            let add = |ids: &Tensor, g: &Tensor| {
                let h = g.size()[g.dim() - 1];
                let rows = g.reshape([-1, h]).to_kind(grad.kind());
                let _ = grad
                    .shallow_clone()
                    .index_add_(0, &ids.reshape([-1]), &rows);
            };
            tch::no_grad(|| {
                add(&p.input_ids, &g_prompts);
                if let (Some((s, _)), Some(g)) = (&self.responses, &g_responses) {
                    add(&s.input_ids, g);
                }
            });
            return;
        }
        let embed = |ids: &Tensor| m.embed(ids, false);
        let mut total = surrogate(&embed(&p.input_ids), &g_prompts);
        if let (Some((s, _)), Some(g)) = (&self.responses, &g_responses) {
            total = total + surrogate(&embed(&s.input_ids), g);
        }
        total.backward();
    }
}
