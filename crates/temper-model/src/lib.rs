//! temper-model: config parsing, the decoder (Llama/Qwen2/Qwen3 by config flags), weight loading
//! (HF folder, hub cache, GGUF import), saving, tokenizer and chat template.
//!
//! # The API in one screen
//! ```no_run
//! use temper_model::{CausalLm, ComputeKind, KvCache, Tokenizer, ChatMessage, GenerationConfig};
//! use tch::{Device, Kind, Tensor};
//! # fn main() -> anyhow::Result<()> {
//! let dir = std::path::Path::new("path/to/hf-folder");
//! let model = CausalLm::load(dir, Device::Cpu, ComputeKind::F32)?; // f32 master weights
//! let tok = Tokenizer::from_dir(dir)?;
//! let gen = GenerationConfig::from_dir(dir, Some(model.config()), Some(&tok))?; // EOS ids
//! let text = tok.apply_chat_template(&[ChatMessage::user("Hi")], true)?;
//! let ids = tok.encode(&text, false)?;
//!
//! // Training: one padded batch, autograd on.
//! let input = Tensor::from_slice(&ids).unsqueeze(0); // (B, T)
//! let mask = input.ones_like(); // (B, T), 1 = real token
//! let pos = temper_model::position_ids_from_mask(&mask); // (B, T)
//! let targets = input.roll([-1], [1]); // next tokens (mask the last position yourself)
//! let scores = model.token_logprobs(&input, &mask, &pos, &targets, 1.0); // logp, entropy: (B, T)
//! let loss = -scores.logp.mean(tch::Kind::Float); // any loss of logp and entropy
//! loss.backward(); // reaches the leaves logp and entropy ...
//! scores.backward(); // ... and this takes it through the chunked unembedding and the decoder
//!
//! // Sampling: same forward, no grad, with a cache; decode one token per step.
//! tch::no_grad(|| {
//!     let mut cache = model.new_cache();
//!     let hidden = model.forward_hidden(&input, &pos, &mask, Some(&mut cache));
//!     let last = model.logits(&hidden.select(1, -1)); // (B, V)
//!     // next step: input (B,1), position (B,1), mask (B, cache.len()+1)
//! });
//! # Ok(()) }
//! ```
//!
//! Conventions:
//! - Tensors: ids/positions i64; `attention_mask` (B, S_past+T) with 1 for real tokens; logits,
//!   logprobs and entropy are f32 whatever the compute dtype.
//! - Padding: left or right, anywhere; positions are per row. A padded row gives the same numbers as
//!   the row alone (pad positions produce finite garbage that nothing reads).
//! - Weights: f32 master copies in a `tch::nn::VarStore` named with HF parameter names; with
//!   [`ComputeKind::Bf16`] matmuls and attention run in bf16 (weights cast at each use).
//! - The same [`CausalLm::forward_hidden`] serves training (no cache, autograd) and sampling
//!   (`tch::no_grad`, [`KvCache`]): identical kernels and mask handling, so sampler and trainer
//!   logprobs agree to float rounding.
pub mod attention;
pub mod chat_template;
pub mod config;
pub mod dtype;
pub mod generation_config;
pub mod gguf;
pub mod head;
pub mod kv_cache;
pub mod load;
pub mod logprobs;
pub mod lora;
pub mod model;
pub mod packed;
pub mod padded;
pub mod policy;
pub mod residency;
pub mod resolve;
pub mod roof;
pub mod rope;
pub mod safetensors_io;
pub mod sampling_weights;
pub mod save;
pub mod seeded;
pub mod shared_base;
pub mod shared_prefix;
pub mod static_decode;
pub mod tokenizer;
pub mod vocab_blocks;

pub use attention::{attention_mask_4d, packed_attention_mask, position_ids_from_mask};
pub use chat_template::{ChatMessage, ChatTemplate};
pub use config::{Arch, ModelConfig, RopeScaling};
pub use dtype::{
    bf16_is_native, bf16_linear_speedup, kernel_report, resolve_compute_kind, ComputeKind,
    DtypeChoice, DtypeRequest, AUTO_BF16_MIN_SPEEDUP,
};
pub use generation_config::GenerationConfig;
pub use head::{default_unembed_chunk, TokenScores, DEFAULT_UNEMBED_CHUNK};
pub use kv_cache::KvCache;
pub use logprobs::{logprobs_and_entropy, logprobs_and_entropy_backward, logprobs_of};
pub use lora::{without_adapters, LoraConfig, LORA_HEAD};
pub use model::{CausalLm, LayerCheckpoints, TRIM_HEAP_MIN_PARAMS};
pub use padded::PaddedRows;
pub use policy::Policy;
pub use residency::LayerResidency;
pub use roof::{DecodeWork, Roof};
pub use shared_base::{SharedBase, SharedBases};
pub use shared_prefix::SharedPrefixRows;
pub use static_decode::DecodeCounts;
pub use tokenizer::Tokenizer;
