//! The model's sampling-time weights: [`CausalLm::with_sampling_weights`] builds the fused,
//! compute-dtype (and on CPU prepacked) copies of [`crate::sampling_weights`] for one sampling
//! call. A child of `model` so that it reads the layers directly.
use super::CausalLm;
use crate::sampling_weights::{FrozenLayer, FrozenLinear, SamplingWeights};

impl CausalLm {
    /// Run `f` (a sampling call, under `tch::no_grad`) with inference copies of the weights: q/k/v
    /// and gate/up fused, in the compute dtype, and on CPU in oneDNN's prepacked layout (see
    /// [`crate::sampling_weights`]). Every forward inside `f` uses them; numbers differ from the
    /// training path by float rounding only. The copies are detached and, on the CPU, dropped
    /// when `f` returns. On CUDA they are kept and the next call copies the new weights into
    /// them (so captured decode steps keep reading the right addresses): they are read only
    /// inside a call, and each call starts by refreshing them. Nested calls reuse the outer
    /// copies.
    pub fn with_sampling_weights<T>(&self, f: impl FnOnce() -> T) -> T {
        if self.sampling.borrow().is_some() {
            return f();
        }
        struct Thaw<'a>(&'a CausalLm);
        impl Drop for Thaw<'_> {
            fn drop(&mut self) {
                self.0.thaw_after_sampling();
            }
        }
        self.freeze_for_sampling();
        let _thaw = Thaw(self);
        f()
    }

    /// Builds the sampling copies now (nothing when they exist): until
    /// [`CausalLm::thaw_after_sampling`], every sampling call uses them, as inside
    /// [`CausalLm::with_sampling_weights`]. With a [`crate::LayerResidency`] each layer is fetched
    /// while its copy is made, so every rank that calls it makes the same calls.
    pub fn freeze_for_sampling(&self) {
        if self.sampling.borrow().is_some() {
            return;
        }
        let mut frozen = tch::no_grad(|| self.freeze());
        // On CUDA the last call's copies take the new values in place: the decode steps
        // captured as CUDA graphs read them where they are.
        if let Some(kept) = self.kept_sampling.borrow_mut().take() {
            if tch::no_grad(|| kept.refresh_from(&frozen)) {
                frozen = kept;
            }
        }
        *self.sampling.borrow_mut() = Some(frozen);
    }

    /// Drops the sampling copies [`CausalLm::freeze_for_sampling`] built (on CUDA they are kept
    /// for the next call to refresh in place).
    pub fn thaw_after_sampling(&self) {
        let frozen = self.sampling.borrow_mut().take();
        if frozen.is_some() && self.device().is_cuda() {
            *self.kept_sampling.borrow_mut() = frozen;
        }
    }

    /// How matmuls run right now: `None` outside [`CausalLm::with_sampling_weights`], else
    /// `Some("onednn-packed")` (CPU with oneDNN), `Some("fbgemm-fp16")` (bf16 on a CPU without a
    /// bf16 dot product) or `Some("fused")` (fused plain copies).
    pub fn sampling_weights_layout(&self) -> Option<&'static str> {
        self.sampling.borrow().as_ref().map(|s| match s.head {
            FrozenLinear::Packed(_) => "onednn-packed",
            FrozenLinear::Fp16(_) => "fbgemm-fp16",
            FrozenLinear::Plain { .. } => "fused",
        })
    }

    /// The kernels this model's training forward and sampling run on this machine, in one line
    /// (`temper bench train`/`bench sample` and `temper train` print it).
    pub fn kernel_report(&self) -> String {
        crate::dtype::kernel_report(self.compute, self.device(), self.config.head_dim)
    }

    fn freeze(&self) -> SamplingWeights {
        let kind = self.compute;
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                self.fetch_layer(i);
                let frozen = FrozenLayer {
                    qkv: FrozenLinear::fuse(
                        &[l.q_proj.part(), l.k_proj.part(), l.v_proj.part()],
                        kind,
                    ),
                    o: FrozenLinear::fuse(&[l.o_proj.part()], kind),
                    gate_up: FrozenLinear::fuse(&[l.gate_proj.part(), l.up_proj.part()], kind),
                    down: FrozenLinear::fuse(&[l.down_proj.part()], kind),
                };
                self.release_layer_after_forward(i);
                frozen
            })
            .collect();
        SamplingWeights {
            layers,
            head: FrozenLinear::fuse(&[(self.head_weight(), None)], kind),
        }
    }
}
