//! temper-model: config parsing, the decoder (Llama/Qwen2/Qwen3 by config flags), weight loading
//! (HF folder, hub cache, GGUF import), saving, tokenizer and chat template.
pub mod gguf;
pub mod resolve;
