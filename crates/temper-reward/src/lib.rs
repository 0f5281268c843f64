//! temper-reward: see Cargo.toml description.
