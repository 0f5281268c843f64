//! temper-train: see Cargo.toml description.
