//! pass@k and mean@k over groups of samples.

/// The unbiased pass@k estimator (Chen et al. 2021): `1 - C(n-c, k) / C(n, k)` for `n` samples of
/// which `c` are correct, computed as a product to stay exact for large `n`.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    assert!(
        k >= 1 && k <= n,
        "pass@k needs 1 <= k <= n (k = {k}, n = {n})"
    );
    if n - c < k {
        return 1.0;
    }
    let mut prod = 1.0;
    for i in (n - c + 1)..=n {
        prod *= 1.0 - k as f64 / i as f64;
    }
    1.0 - prod
}

/// The k values reported for `n` samples per prompt: 1, 2, 4, ... and n.
pub fn ks_for(n: usize) -> Vec<usize> {
    let mut ks: Vec<usize> = std::iter::successors(Some(1usize), |k| Some(k * 2))
        .take_while(|&k| k <= n)
        .collect();
    if ks.last() != Some(&n) {
        ks.push(n);
    }
    ks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force: the probability that a random k-subset of n contains a correct sample.
    fn brute(n: usize, c: usize, k: usize) -> f64 {
        let (mut hit, mut total) = (0u64, 0u64);
        for mask in 0u32..(1 << n) {
            if mask.count_ones() as usize != k {
                continue;
            }
            total += 1;
            if (0..c).any(|i| mask & (1 << i) != 0) {
                hit += 1;
            }
        }
        hit as f64 / total as f64
    }

    #[test]
    fn pass_at_k_equals_subset_counting() {
        for n in 1..=8 {
            for c in 0..=n {
                for k in 1..=n {
                    let (a, b) = (pass_at_k(n, c, k), brute(n, c, k));
                    assert!((a - b).abs() < 1e-12, "n={n} c={c} k={k}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn ks() {
        assert_eq!(ks_for(1), vec![1]);
        assert_eq!(ks_for(4), vec![1, 2, 4]);
        assert_eq!(ks_for(6), vec![1, 2, 4, 6]);
    }
}
