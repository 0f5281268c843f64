//! Small statistics for the metrics line.
use std::collections::BTreeMap;

pub type StepMetrics = BTreeMap<String, f64>;

/// `prefix/mean`, `prefix/max`, `prefix/min` of `v` (nothing when empty).
pub fn put_mmm(m: &mut StepMetrics, prefix: &str, v: &[f64]) {
    if v.is_empty() {
        return;
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let max = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let min = v.iter().cloned().fold(f64::INFINITY, f64::min);
    m.insert(format!("{prefix}/mean"), mean);
    m.insert(format!("{prefix}/max"), max);
    m.insert(format!("{prefix}/min"), min);
}

/// Accumulates per-micro-batch metrics and reduces them at the end of the update.
#[derive(Default)]
pub struct MetricAcc {
    sums: BTreeMap<String, (f64, f64)>,
}

impl MetricAcc {
    /// Adds `value` with `weight` (weighted mean at the end).
    pub fn add(&mut self, key: &str, value: f64, weight: f64) {
        let e = self.sums.entry(key.to_string()).or_insert((0.0, 0.0));
        e.0 += value * weight;
        e.1 += weight;
    }

    /// Data-parallel: sums every rank's values and weights, so that [`MetricAcc::finish`] gives
    /// the weighted mean over all ranks' micro-batches. Keys in `summed` were added once per
    /// mini-batch as already-summed parts (weight 1 on every rank): their weights are not summed.
    pub fn all_reduce(&mut self, dist: &crate::dist::Dist, summed: &[&str]) -> anyhow::Result<()> {
        if dist.world == 1 {
            return Ok(());
        }
        let counts = dist.gather_f64(&[self.sums.len() as f64])?;
        if counts.iter().any(|c| c[0] != self.sums.len() as f64) {
            anyhow::bail!(
                "rank {}: ranks report different metrics (counts {counts:?}): their configs differ",
                dist.rank
            );
        }
        let mut flat: Vec<f64> = self.sums.values().flat_map(|(s, w)| [*s, *w]).collect();
        dist.sum_f64(&mut flat)?;
        for ((k, e), sw) in self.sums.iter_mut().zip(flat.chunks(2)) {
            let w = if summed.contains(&k.as_str()) {
                sw[1] / dist.world as f64
            } else {
                sw[1]
            };
            *e = (sw[0], w);
        }
        Ok(())
    }

    /// Adds an already weighted `sum` and its `weight`.
    fn add_sum(&mut self, key: &str, sum: f64, weight: f64) {
        let e = self.sums.entry(key.to_string()).or_insert((0.0, 0.0));
        e.0 += sum;
        e.1 += weight;
    }

    pub fn finish(self, out: &mut StepMetrics) {
        for (k, (s, w)) in self.sums {
            if w > 0.0 {
                out.insert(k, s / w);
            }
        }
    }
}

/// [`MetricAcc`]'s sums kept on the device the losses run on, so that a micro-batch loop reads
/// nothing back: [`DeviceMetricAcc::read`] copies every sum and weight in one go at the end.
/// The same f64 products and sums in the same order, so the same bits as [`MetricAcc`].
#[derive(Default)]
pub struct DeviceMetricAcc {
    sums: BTreeMap<&'static str, (tch::Tensor, tch::Tensor)>,
}

impl DeviceMetricAcc {
    /// Adds `value` (a 0-dim f64 tensor) with `weight` (likewise).
    pub fn add(&mut self, key: &'static str, value: &tch::Tensor, weight: &tch::Tensor) {
        let product = value * weight;
        match self.sums.get_mut(key) {
            Some((s, w)) => {
                *s = &*s + product;
                *w = &*w + weight;
            }
            None => {
                self.sums.insert(key, (product, weight.shallow_clone()));
            }
        }
    }

    /// The sums on the host, as a [`MetricAcc`].
    pub fn read(self) -> MetricAcc {
        let tensors: Vec<&tch::Tensor> = self.sums.values().flat_map(|(s, w)| [s, w]).collect();
        let values = temper_algo::read_all(&tensors);
        let mut acc = MetricAcc::default();
        for (key, sw) in self.sums.keys().zip(values.chunks(2)) {
            acc.add_sum(key, sw[0], sw[1]);
        }
        acc
    }
}
