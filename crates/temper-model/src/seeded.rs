//! Seeded draws from libtorch's one global generator.
//!
//! `tch` gives no per-call generator, so a seeded initialisation is `manual_seed` followed by the
//! draws. Two threads doing that at once (a server creating two LoRA models with the same seed)
//! interleave their draws and get different weights for the same seed; every seeded draw in
//! temper goes through [`with_seed`], which holds one process-wide lock across the seed and the
//! draws.

use std::sync::Mutex;

static GLOBAL_GENERATOR: Mutex<()> = Mutex::new(());

/// Runs `draw` right after seeding libtorch's global generator with `seed`, with no other seeded
/// draw in between.
pub fn with_seed<T>(seed: u64, draw: impl FnOnce() -> T) -> T {
    let _only_one = GLOBAL_GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(seed as i64);
    draw()
}
