//! temper-rollout: see Cargo.toml description.
