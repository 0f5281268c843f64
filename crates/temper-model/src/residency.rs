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

use tch::Tensor;

use crate::model::Part;
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

    /// The parts of the model in the order a layer-at-a-time pass takes them: what lies outside
    /// the decoder layers, then each layer.
    pub(crate) fn parts(&self) -> Vec<Part> {
        std::iter::once(Part::Rest)
            .chain((0..self.num_layers()).map(Part::Layer))
            .collect()
    }

    /// `f` over the merged parameters of `part` ([`CausalLm::merged_parameters`]'s names and
    /// values), a decoder layer fetched before and let go after: while `f` runs that layer's
    /// weights are whole.
    pub(crate) fn with_part<T>(&self, part: Part, f: impl FnOnce(Vec<(String, Tensor)>) -> T) -> T {
        if let Part::Layer(i) = part {
            self.fetch_layer(i);
        }
        let out = f(self.merged_parameters_where(|p| p == part));
        if let Part::Layer(i) = part {
            self.release_layer_after_forward(i);
        }
        out
    }

    /// Hands `take` the merged parameters a part at a time (those outside the decoder layers,
    /// then each layer's, fetched before and let go after): with a sharded run's layers one
    /// layer is whole at a time, never the model. Every rank must call this (each fetch may be a
    /// collective; a rank with nothing to take calls [`CausalLm::sweep_layers`]); after `take`
    /// fails the other parts are still fetched, so the ranks stay in step, and the first error
    /// is returned.
    pub fn for_each_part(
        &self,
        take: &mut dyn FnMut(Vec<(String, Tensor)>) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let mut first_error = None;
        for part in self.parts() {
            self.with_part(part, |params| {
                if first_error.is_none() {
                    first_error = take(params).err();
                }
            });
        }
        first_error.map_or(Ok(()), Err)
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
