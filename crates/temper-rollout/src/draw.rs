//! Per-sample random streams and the categorical draw.
//!
//! Every sample owns a ChaCha20 stream derived from `(seed, sample_index)` alone, and takes exactly
//! one uniform number per generated token (greedy rows too), so its tokens do not depend on what
//! else shares the batch. Torch's global generator is never used.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// The random stream of sample `sample_index` of a request seeded with `seed`.
pub fn sample_rng(seed: u64, sample_index: usize) -> ChaCha20Rng {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    rng.set_stream(sample_index as u64);
    rng
}

/// A per-request seed from a run seed (e.g. `--seed`) and the request's index, so that requests in
/// one run get unrelated streams (SplitMix64 finaliser of `base + index * golden ratio`).
pub fn request_seed(base: u64, request_index: usize) -> u64 {
    let mut z = base.wrapping_add(
        (request_index as u64)
            .wrapping_add(1)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One uniform number in [0, 1) for the next token of a sample.
pub fn next_uniform(rng: &mut ChaCha20Rng) -> f64 {
    rng.random::<f64>()
}

/// Inverse-CDF draw: the first index whose cumulative probability (summed in f64 and scaled by the
/// total, so the weights need not sum to 1) exceeds `u`. Zero-weight entries are never returned.
/// `None` if no weight is positive (or any is NaN).
pub fn draw_index(weights: &[f32], u: f64) -> Option<usize> {
    let mut total = 0f64;
    for &w in weights {
        if w.is_nan() {
            return None;
        }
        total += w.max(0.0) as f64;
    }
    if total <= 0.0 || !total.is_finite() {
        return None;
    }
    let target = u * total;
    let mut acc = 0f64;
    let mut last_positive = None;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            acc += w as f64;
            last_positive = Some(i);
            if acc > target {
                return Some(i);
            }
        }
    }
    // Rounding can leave `acc` a hair below `target` when u is close to 1.
    last_positive
}

/// Index of the largest value; the lowest index wins ties (like `torch.argmax`). NaNs are skipped.
pub fn argmax(values: &[f32]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in values.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<f64> = (0..4)
            .map(|_| next_uniform(&mut sample_rng(7, 0)))
            .collect();
        assert!(a.iter().all(|&x| x == a[0]));
        let mut r0 = sample_rng(7, 0);
        let mut r1 = sample_rng(7, 1);
        let mut r2 = sample_rng(8, 0);
        let (x0, x1, x2) = (
            next_uniform(&mut r0),
            next_uniform(&mut r1),
            next_uniform(&mut r2),
        );
        assert!(x0 != x1 && x0 != x2 && x1 != x2);
        assert!((0.0..1.0).contains(&x0));
    }

    #[test]
    fn request_seeds_match_splitmix64() {
        // SplitMix64's first outputs for state 0 (Vigna's reference implementation).
        assert_eq!(request_seed(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(request_seed(0, 1), 0x6E78_9E6A_A1B9_65F4);
        assert_ne!(request_seed(1, 0), request_seed(0, 0));
    }

    #[test]
    fn draw_follows_the_cdf() {
        let w = [0.0, 0.25, 0.0, 0.75];
        assert_eq!(draw_index(&w, 0.0), Some(1));
        assert_eq!(draw_index(&w, 0.2499), Some(1));
        assert_eq!(draw_index(&w, 0.25), Some(3));
        assert_eq!(draw_index(&w, 0.999_999_999), Some(3));
        // Unnormalised weights are scaled by their total.
        assert_eq!(draw_index(&[2.0, 2.0], 0.49), Some(0));
        assert_eq!(draw_index(&[2.0, 2.0], 0.51), Some(1));
        // Zero-weight tail is never picked, even when u rounds past the total.
        assert_eq!(draw_index(&[1.0, 0.0], 1.0), Some(0));
        assert_eq!(draw_index(&[0.0, 0.0], 0.5), None);
        assert_eq!(draw_index(&[f32::NAN, 1.0], 0.5), None);
    }

    #[test]
    fn draw_frequencies_match_weights() {
        // Chi-square goodness of fit with 3 degrees of freedom; 16.27 is the 0.999 quantile.
        let w = [0.1f32, 0.2, 0.3, 0.4];
        let mut rng = sample_rng(123, 0);
        let n = 20_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[draw_index(&w, next_uniform(&mut rng)).unwrap()] += 1;
        }
        let chi2: f64 = counts
            .iter()
            .zip(w)
            .map(|(&c, p)| {
                let e = n as f64 * p as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum();
        assert!(chi2 < 16.27, "chi2 = {chi2}, counts {counts:?}");
    }

    #[test]
    fn argmax_takes_first_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NAN]), Some(1));
        assert_eq!(argmax(&[f32::NEG_INFINITY]), Some(0));
        assert_eq!(argmax(&[]), None);
    }
}
