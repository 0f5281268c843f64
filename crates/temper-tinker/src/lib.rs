//! temper-tinker: the Tinker training API with Tinker's semantics, over temper's model core, so
//! that `temper serve`'s Tinker endpoints (and Rust callers) are thin layers on it.
//!
//! - [`Datum`]: a `model_input` token list and its `loss_fn_inputs` (`target_tokens`, `weights`,
//!   `logprobs`, `advantages`), validated with errors naming the datum index and the field.
//! - [`SequenceRecords`]: what samplers recorded for StableReinforce (`record_stability_info`),
//!   bounded, and the check of a datum's [`Provenance`] against it.
//! - [`TrainingModel::forward`] / [`TrainingModel::forward_backward`]: per-datum logprobs of the
//!   targets and the loss (`loss:sum`), a SUM over tokens and datums
//!   ([`temper_algo::TinkerLoss`]); `forward_backward` accumulates gradients across calls.
//! - [`TrainingModel::optim_step`]: AdamW with Tinker's [`AdamParams`] (defaults betas 0.9/0.95,
//!   eps 1e-12, weight decay 0, no clipping) on the accumulated gradients, then zeroes them.
//! - [`TrainingModel::save_weights_for_sampler`] -> [`SamplingModel`]: a snapshot (an HF folder,
//!   LoRA merged) that keeps sampling the weights it was made from; `sample` and
//!   `compute_logprobs`.
//! - [`TrainingModel::save_state`] / [`TrainingModel::load_state`]: weights (or adapters) with or
//!   without the optimizer state.

mod datum;
pub mod prompt_pass;
pub mod prompt_topk;
pub mod provenance;
mod sampling;
mod state;
mod training;

pub use datum::{Datum, TensorData};
pub use prompt_pass::{
    alt_draws, score_prompt, target_logprobs, AltDraws, PromptAsk, PromptScores, TargetCell,
};
pub use prompt_topk::{prompt_topk, prompt_topk_ranked, PositionTop, TopTokens};
pub use provenance::{Provenance, Recorded, SequenceRecords, Span, SpanSource};
pub use sampling::{
    engine_request, prompt_logprobs, sampled_sequence, SampledSequence, SamplingModel,
    TinkerSamplingParams,
};
pub use training::{AdamParams, ForwardOutput, TrainingModel};
