//! GGUF import: parse, dequantize, write an HF folder. (owner: gguf engineer)
