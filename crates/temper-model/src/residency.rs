//! Decoder layers whose weights are not always held whole: sharded training (the trainer's
//! `actor.strategy = fsdp`) keeps each layer's weights as slices over the ranks and gathers a
//! layer only while it computes. The model says when it needs a layer and when it is done; the
//! trainer's [`LayerResidency`] decides what that costs (a gather, nothing when the layer is
//! already whole). Every rank must make the same calls in the same order (each one may be a
//! collective), so the forwards and backwards that use it call it once per layer per sweep,
//! whatever their data: a sweep with nothing to compute still calls it
//! ([`CausalLm::sweep_layers_without_compute`]). Sampling asks once per layer while it builds its
//! copies ([`CausalLm::freeze_for_sampling`]) and never while it decodes (the copies hold the
//! matrices, the layers' vectors stay whole), so ranks may decode different numbers of steps.

use std::sync::Arc;

use crate::CausalLm;

/// Where a decoder layer's weights come from while the model runs it.
pub trait LayerResidency: std::fmt::Debug + Send + Sync {
    /// Layer `i`'s weights must be whole in the model's parameters from now on.
    fn fetch(&self, i: usize);
    /// The forward is done with layer `i` (its weights may go).
    fn release_after_forward(&self, i: usize);
    /// The activation-checkpointed backward has added layer `i`'s gradients to its parameters'
    /// `.grad` and is done with the layer.
    fn backward_done(&self, i: usize);
}

impl CausalLm {
    /// From now on every sweep over the decoder layers asks `residency` for each layer's
    /// weights; `None`: the weights are always whole (the default).
    pub fn set_layer_residency(&self, residency: Option<Arc<dyn LayerResidency>>) {
        *self.residency.borrow_mut() = residency;
    }

    pub(crate) fn fetch_layer(&self, i: usize) {
        if let Some(r) = self.residency.borrow().as_ref() {
            r.fetch(i);
        }
    }

    pub(crate) fn release_layer_after_forward(&self, i: usize) {
        if let Some(r) = self.residency.borrow().as_ref() {
            r.release_after_forward(i);
        }
    }

    pub(crate) fn layer_backward_done(&self, i: usize) {
        if let Some(r) = self.residency.borrow().as_ref() {
            r.backward_done(i);
        }
    }

    /// The residency calls of a forward sweep that has nothing to compute (a segment a rank's
    /// data left empty), so that every rank makes the same ones.
    pub(crate) fn sweep_layers_without_compute(&self) {
        if self.residency.borrow().is_none() {
            return;
        }
        for i in 0..self.num_layers() {
            self.fetch_layer(i);
            self.release_layer_after_forward(i);
        }
    }

    /// The residency calls of a micro-batch this rank does not have (its share of the batch
    /// was one micro-batch short of another rank's): `forward_sweeps` forward sweeps and, with
    /// `backward`, the backward's, computing nothing.
    pub fn sweep_idle_micro_batch(&self, forward_sweeps: usize, backward: bool) {
        for _ in 0..forward_sweeps {
            self.sweep_layers_without_compute();
        }
        if backward {
            self.sweep_backward_without_compute();
        }
    }

    /// The residency calls of a backward sweep with no gradient to take through the layers.
    pub(crate) fn sweep_backward_without_compute(&self) {
        if self.residency.borrow().is_none() {
            return;
        }
        for i in (0..self.num_layers()).rev() {
            self.fetch_layer(i);
            self.layer_backward_done(i);
        }
    }
}
