//! temper-rollout: batched sampling on temper's model with a KV cache, returning the logprob of
//! every sampled token. See `docs/rollout.md` for the exact semantics.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use temper_rollout::{Engine, Request, SamplingParams};
//! # let dir = std::path::Path::new("model");
//! let model = temper_model::CausalLm::load(dir, tch::Device::Cpu, temper_model::ComputeKind::F32)?;
//! let tok = temper_model::Tokenizer::from_dir(dir)?;
//! let gen = temper_model::GenerationConfig::from_dir(dir, Some(model.config()), Some(&tok))?;
//! let engine = Engine::new(&model, gen.eos_token_ids).with_decoder(&tok);
//! let params = SamplingParams { n: 4, max_tokens: 64, seed: Some(0), ..Default::default() };
//! let requests = vec![Request { prompt_ids: tok.encode("What is 7 * 8?", false)?, params }];
//! for s in engine.generate(&requests, &mut |_| {})? {
//!     println!("{:?} {:?} {:?}", s.completion_ids, s.completion_logprobs, s.finish);
//! }
//! # Ok(()) }
//! ```
pub mod draw;
pub mod engine;
pub mod params;
pub mod processors;
pub mod remote;
mod running_batch;
pub mod sample_step;
pub mod sampler;
pub mod scheduler;
mod slot_batch;
pub mod stop;
pub mod verify;

pub use engine::{DecodeMode, Engine, EngineConfig, Incoming, Progress};
pub use params::{Finish, LogprobKind, Request, Sample, SamplingParams, StopReason};
pub use sampler::Sampler;
pub use stop::Decode;

/// Stop strings are matched on text decoded with special tokens kept.
impl Decode for temper_model::Tokenizer {
    fn decode(&self, ids: &[i64]) -> anyhow::Result<String> {
        temper_model::Tokenizer::decode(self, ids, false)
    }
}
