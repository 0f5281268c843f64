//! Per-sample random streams and the categorical draw.
//!
//! Every sample owns a ChaCha20 stream derived from `(seed, sample_index)` alone, and takes exactly
//! one 64-bit key from it per generated token (greedy rows too), so its tokens do not depend on what
//! else shares the batch. Torch's global generator is never used.
//!
//! The draw is an exponential race (the Gumbel-max trick in probability space): token `i` gets
//! `E_i = -ln(u_i)` with `u_i` uniform, and the token with the largest `p_i / E_i` wins, which picks
//! `i` with probability exactly `p_i / sum(p)`. Why not an inverse-CDF search: there a token is
//! picked by where `u` falls among cumulative sums, and a float-rounding change in the logits (a row
//! decoded in a different batch computes its logits with other GEMM and attention shapes) moves
//! every boundary in the long tail, so draws that land in the tail flip (on SmolLM2, 2 of 64 seeded
//! samples changed a token between two batch layouts). In the race a rounding change only matters
//! when the two best `p_i / E_i` are within rounding of each other, which is about 1e-5 per token.
//! The `u_i` are SplitMix64 outputs keyed by the token's key and `i` (counter-based, so zero-weight
//! entries cost nothing and the result does not depend on the order of evaluation).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use tch::{Kind, Tensor};
use temper_base::seed::{mix64, GOLDEN_GAMMA};

/// The random stream of sample `sample_index` of a request seeded with `seed`.
pub fn sample_rng(seed: u64, sample_index: usize) -> ChaCha20Rng {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    rng.set_stream(sample_index as u64);
    rng
}

/// A per-request seed from a run seed (e.g. `--seed`) and the request's index, so that requests in
/// one run get unrelated streams (SplitMix64 finaliser of `base + index * golden ratio`).
pub fn request_seed(base: u64, request_index: usize) -> u64 {
    mix64(
        base.wrapping_add(
            (request_index as u64)
                .wrapping_add(1)
                .wrapping_mul(GOLDEN_GAMMA),
        ),
    )
}

/// The key of a sample's next token (one per token, greedy rows too).
pub fn next_key(rng: &mut ChaCha20Rng) -> u64 {
    rng.random::<u64>()
}

/// The uniform number of entry `index` for a token keyed `key`: the `index + 1`-th output of
/// SplitMix64 started at `key`, as a float in (0, 1] (53 bits, never 0, so `-ln u` is finite).
#[inline(always)]
pub fn race_uniform(key: u64, index: usize) -> f64 {
    let z = mix64(key.wrapping_add((index as u64).wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)));
    ((z >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Exponential-race draw: the index maximising `w_i / -ln(race_uniform(key, i))` over the positive
/// weights (they need not sum to 1; the lowest index wins an exact tie). Zero-weight entries are
/// never returned; `None` if no weight is positive (or any is NaN).
///
/// Most entries are rejected without a logarithm: `-ln u >= 1 - u`, so `w / (1 - u)` bounds an
/// entry's score, and an entry whose bound does not beat the best so far cannot win. The bound is
/// checked 16 entries at a time against the best score at the block's start (a superset of the
/// survivors, which the scalar pass then checks against the current best), so the hashing and the
/// check vectorise; on x86-64 the loop is compiled for AVX-512 and AVX2 too and picked at run time.
pub fn draw_index(weights: &[f32], key: u64) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512dq") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { draw_index_avx512(weights, key) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe { draw_index_avx2(weights, key) };
        }
    }
    draw_index_blocks(weights, key)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn draw_index_avx512(weights: &[f32], key: u64) -> Option<usize> {
    draw_index_blocks(weights, key)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn draw_index_avx2(weights: &[f32], key: u64) -> Option<usize> {
    draw_index_blocks(weights, key)
}

#[inline(always)]
fn draw_index_blocks(weights: &[f32], key: u64) -> Option<usize> {
    const BLOCK: usize = 16;
    let mut best: Option<(usize, f64)> = None;
    for (b, block) in weights.chunks(BLOCK).enumerate() {
        let base = b * BLOCK;
        let bound = best.map_or(0.0, |(_, s)| s);
        // Entries that may beat `bound` (NaNs too, so they are seen below), as a bit mask.
        let mut candidates = 0u32;
        for (j, &w) in block.iter().enumerate() {
            let u = race_uniform(key, base + j);
            let w = w as f64;
            let maybe = w > bound * (1.0 - u) || w.is_nan();
            candidates |= u32::from(maybe) << j;
        }
        while candidates != 0 {
            let j = candidates.trailing_zeros() as usize;
            candidates &= candidates - 1;
            let w = block[j];
            if w.is_nan() {
                return None;
            }
            if w <= 0.0 {
                continue;
            }
            let (w, u) = (w as f64, race_uniform(key, base + j));
            if let Some((_, b)) = best {
                if w <= b * (1.0 - u) {
                    continue;
                }
            }
            let score = w / -u.ln();
            if best.is_none_or(|(_, b)| score > b) {
                best = Some((base + j, score));
            }
        }
    }
    best.map(|(i, _)| i)
}

/// The exponential race of [`draw_index`] on a tensor's own device: `weights` (rows, V) f32,
/// `keys` (rows,) i64 holding each row's u64 key bit for bit. Returns (rows,) i64 on that device:
/// the index [`draw_index`] returns for the row, or -1 where it returns `None` (no positive
/// weight, or a NaN).
///
/// The uniforms are [`race_uniform`]'s SplitMix64 outputs computed with wrapping int64 tensor ops
/// (a logical right shift is an arithmetic one masked to the low bits), and the scores are the
/// same f64 `w / -ln u`, so CPU and CUDA draw the same token from the same probabilities, and
/// nothing of the vocabulary leaves the device. No pruning: every entry is scored (one pass of a
/// few elementwise kernels, cheap on a GPU). Rows go a slice at a time so that the int64 and f64
/// temporaries stay near 128 MB each whatever the batch and vocabulary.
pub fn draw_index_tensor(weights: &Tensor, keys: &Tensor) -> Tensor {
    let (rows, vocab) = weights.size2().expect("weights must be (rows, vocab)");
    assert_eq!(keys.size(), [rows], "one key per row");
    let device = weights.device();
    // (index + 1) * gamma, wrapping: the offset SplitMix64 adds to the key for entry `index`.
    let offsets = (Tensor::arange_start(1, vocab + 1, (Kind::Int64, device)) * GOLDEN_GAMMA as i64)
        .unsqueeze(0);
    let keys = keys.to_device(device).to_kind(Kind::Int64).unsqueeze(1);
    let slice = (16_777_216 / vocab.max(1)).max(1);
    let mut out = Vec::new();
    let mut start = 0;
    while start < rows {
        let n = slice.min(rows - start);
        let w = weights.narrow(0, start, n);
        let z = mix64_tensor(&(keys.narrow(0, start, n) + &offsets));
        // ((z >> 11) + 1) / 2^53 in (0, 1], exactly as `race_uniform` forms it.
        let u =
            (shift_right_logical(&z, 11) + 1).to_kind(Kind::Double) * (1.0 / (1u64 << 53) as f64);
        let w64 = w.to_kind(Kind::Double);
        let score = (&w64 / -u.log()).where_self(&w64.gt(0.0), &w64.full_like(-1.0));
        let (best, index) = score.max_dim(1, false);
        let none = best.le(0.0).logical_or(&w.isnan().any_dim(1, false));
        out.push(index.masked_fill(&none, -1));
        start += n;
    }
    Tensor::cat(&out, 0)
}

/// [`mix64`] on every element of an int64 tensor, wrapping like u64 arithmetic.
fn mix64_tensor(z: &Tensor) -> Tensor {
    let z = z.bitwise_xor_tensor(&shift_right_logical(z, 30)) * 0xBF58_476D_1CE4_E5B9u64 as i64;
    let z = z.bitwise_xor_tensor(&shift_right_logical(&z, 27)) * 0x94D0_49BB_1331_11EBu64 as i64;
    z.bitwise_xor_tensor(&shift_right_logical(&z, 31))
}

/// `z >> n` on int64 as on u64: libtorch's shift is arithmetic, so the copied sign bits are masked.
fn shift_right_logical(z: &Tensor, n: u32) -> Tensor {
    z.bitwise_right_shift_tensor_scalar(n as i64)
        .bitwise_and(((1u64 << (64 - n)) - 1) as i64)
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
        let a: Vec<u64> = (0..4).map(|_| next_key(&mut sample_rng(7, 0))).collect();
        assert!(a.iter().all(|&x| x == a[0]));
        let mut r0 = sample_rng(7, 0);
        let mut r1 = sample_rng(7, 1);
        let mut r2 = sample_rng(8, 0);
        let (x0, x1, x2) = (next_key(&mut r0), next_key(&mut r1), next_key(&mut r2));
        assert!(x0 != x1 && x0 != x2 && x1 != x2);
        assert_ne!(next_key(&mut r0), x0);
    }

    #[test]
    fn request_seeds_match_splitmix64() {
        // SplitMix64's first outputs for state 0 (Vigna's reference implementation).
        assert_eq!(request_seed(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(request_seed(0, 1), 0x6E78_9E6A_A1B9_65F4);
        assert_ne!(request_seed(1, 0), request_seed(0, 0));
    }

    #[test]
    fn race_uniforms_are_splitmix64() {
        // SplitMix64 started at 0 gives 0xE220A8397B1DCDAF first (Vigna's reference).
        let want = ((0xE220_A839_7B1D_CDAFu64 >> 11) + 1) as f64 / (1u64 << 53) as f64;
        assert_eq!(race_uniform(0, 0), want);
        for i in 0..1000 {
            let u = race_uniform(42, i);
            assert!(u > 0.0 && u <= 1.0);
        }
    }

    /// The pruned, blocked race returns what a plain argmax of `w_i / -ln u_i` over positive
    /// weights returns: short rows (partial blocks) and vocabulary-sized ones.
    #[test]
    fn race_equals_the_unpruned_argmax() {
        let mut rng = sample_rng(5, 0);
        for case in 0..330 {
            let v = if case < 300 {
                1 + case % 97
            } else {
                [1000, 4099, 49_152][case % 3]
            };
            let w: Vec<f32> = (0..v)
                .map(|_| {
                    let x: f64 = rng.random();
                    // A long tail of tiny weights and some exact zeros, like top-p output.
                    if x < 0.2 {
                        0.0
                    } else {
                        (x.powi(8)) as f32
                    }
                })
                .collect();
            let key = next_key(&mut rng);
            let plain = w
                .iter()
                .enumerate()
                .filter(|(_, &x)| x > 0.0)
                .map(|(i, &x)| (i, x as f64 / -race_uniform(key, i).ln()))
                .fold(None, |best: Option<(usize, f64)>, (i, s)| match best {
                    Some((_, b)) if b >= s => best,
                    _ => Some((i, s)),
                })
                .map(|(i, _)| i);
            assert_eq!(draw_index(&w, key), plain, "case {case}: {w:?}");
        }
    }

    #[test]
    fn zero_weights_nan_and_empty() {
        let mut rng = sample_rng(9, 0);
        for _ in 0..1000 {
            let t = draw_index(&[0.0, 0.25, 0.0, 0.75, 0.0], next_key(&mut rng)).unwrap();
            assert!(t == 1 || t == 3);
        }
        assert_eq!(draw_index(&[0.0, 0.0], 1), None);
        assert_eq!(draw_index(&[], 1), None);
        assert_eq!(draw_index(&[f32::NAN, 1.0], 1), None);
        assert_eq!(draw_index(&[0.0, 3.0], 1), Some(1));
    }

    #[test]
    fn draw_frequencies_match_weights() {
        // Chi-square goodness of fit with 3 degrees of freedom; 16.27 is the 0.999 quantile.
        // Unnormalised weights: the race is scale-free.
        let w = [0.1f32, 0.2, 0.3, 0.4];
        let scaled: Vec<f32> = w.iter().map(|x| x * 7.0).collect();
        let mut rng = sample_rng(123, 0);
        let n = 20_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[draw_index(&scaled, next_key(&mut rng)).unwrap()] += 1;
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

    /// Rounding-size changes to the logits (1e-5, what a row decoded in another batch layout sees)
    /// almost never change the draw. Logits ~ N(0, 2.5^2) over a 49,152-token vocabulary put much
    /// of the mass in a long tail, where an inverse-CDF draw flips in about 5 of 1000 draws (numpy,
    /// same setting); the race is expected to flip in about 1 in 100,000.
    #[test]
    fn rounding_noise_rarely_flips_a_draw() {
        let mut rng = sample_rng(11, 0);
        let v = 49_152;
        let softmax = |logits: &[f64]| -> Vec<f32> {
            let m = logits.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = logits.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            e.iter().map(|x| (x / z) as f32).collect()
        };
        let (draws, mut flips) = (1000, 0);
        for _ in 0..draws {
            // Box-Muller normals.
            let logits: Vec<f64> = (0..v)
                .map(|_| {
                    let (a, b): (f64, f64) = (rng.random(), rng.random());
                    2.5 * (-2.0 * (1.0 - a).ln()).sqrt() * (std::f64::consts::TAU * b).cos()
                })
                .collect();
            let noisy: Vec<f64> = logits
                .iter()
                .map(|x| x + 1e-5 * (2.0 * rng.random::<f64>() - 1.0))
                .collect();
            let key = next_key(&mut rng);
            flips += usize::from(
                draw_index(&softmax(&logits), key) != draw_index(&softmax(&noisy), key),
            );
        }
        assert!(flips <= 2, "{flips} of {draws} draws flipped");
    }

    /// The tensor race draws what the host race draws, key for key: long-tailed weights with
    /// zeros, a NaN row and an all-zero row, on a vocabulary-sized row.
    #[test]
    fn tensor_race_equals_the_host_race() {
        let mut rng = sample_rng(17, 0);
        let (rows, v) = (24usize, 4_099usize);
        let mut w: Vec<f32> = (0..rows * v)
            .map(|_| {
                let x: f64 = rng.random();
                if x < 0.3 {
                    0.0
                } else {
                    x.powi(12) as f32
                }
            })
            .collect();
        w[3 * v + 7] = f32::NAN;
        w[5 * v..6 * v].iter_mut().for_each(|x| *x = 0.0);
        for round in 0..5 {
            let keys: Vec<u64> = (0..rows).map(|_| next_key(&mut rng)).collect();
            let want: Vec<i64> = (0..rows)
                .map(|r| draw_index(&w[r * v..(r + 1) * v], keys[r]).map_or(-1, |i| i as i64))
                .collect();
            let weights = Tensor::from_slice(&w).view([rows as i64, v as i64]);
            let k: Vec<i64> = keys.iter().map(|&k| k as i64).collect();
            let got =
                Vec::<i64>::try_from(draw_index_tensor(&weights, &Tensor::from_slice(&k))).unwrap();
            assert_eq!(got, want, "round {round}");
            assert_eq!((got[3], got[5]), (-1, -1));
        }
    }

    #[test]
    fn argmax_takes_first_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NAN]), Some(1));
        assert_eq!(argmax(&[f32::NEG_INFINITY]), Some(0));
        assert_eq!(argmax(&[]), None);
    }
}
