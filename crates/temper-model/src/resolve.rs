//! Resolve a model spec (path, hub id, known PyPI-shipped alias) to an HF folder. (owner: gguf engineer)
