//! GGUF import: parse a llama.cpp GGUF file (v2/v3), dequantize its tensors to f32, and write a
//! Hugging Face folder the rest of temper (and transformers) loads like any other model.
//!
//! ```no_run
//! let report = temper_model::gguf::convert_gguf("model.gguf".as_ref(), "out".as_ref())?;
//! # anyhow::Ok(())
//! ```
//!
//! - [`reader`]: header, metadata, tensor infos, memory-mapped data;
//! - [`dequant`]: F32/F16/BF16, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, Q2_K/Q3_K/Q4_K/Q5_K/Q6_K -> f32;
//! - [`names`]: llama.cpp -> HF tensor names, Llama Q/K un-permutation;
//! - [`hf_config`], [`tokenizer`]: config.json, generation_config.json, tokenizer.json, tokenizer_config.json;
//! - [`convert`]: the whole conversion.

pub mod convert;
pub mod dequant;
pub mod hf_config;
pub mod names;
pub mod reader;
pub mod tokenizer;
pub mod types;

pub use convert::{convert_gguf, ConvertReport};
pub use dequant::dequantize;
pub use reader::{GgufFile, MetaValue, TensorInfo};
pub use types::GgmlType;
