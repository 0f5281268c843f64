//! Seeds and hashes: temper's one SplitMix64 (Vigna's), for sampling draws, request seeds, the
//! trainer's and the environments' seed mixing, and tests' randomness.

/// SplitMix64's finaliser (Vigna), a bijection on u64 with full avalanche: the module's one mixer.
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64's increment (2^64 / the golden ratio).
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// A seed derived from `seed` and two indices (a batch and a position, a question and a debate):
/// the trainer's and the environments' seed mixing.
pub fn mix(seed: u64, a: u64, b: u64) -> u64 {
    mix_family(seed, a, b, 0xC2B2_AE3D_27D4_EB4F)
}

/// [`mix`] with another odd multiplier for `b`: a second family of seeds from the same
/// `(seed, a, b)`, unrelated to [`mix`]'s (debate's per-question seeds come from [`mix`], the
/// seeds of each ask within a debate from this, as recorded debates were made).
pub fn mix_family(seed: u64, a: u64, b: u64, b_multiplier: u64) -> u64 {
    mix64(seed ^ a.wrapping_mul(GOLDEN_GAMMA) ^ b.wrapping_mul(b_multiplier))
}
