//! Metrics that stay on the device until they are read, all together: a loss computed on a GPU
//! reports its metrics without a host sync per value ([`DeviceMetrics::read`] makes one copy).

use std::collections::BTreeMap;

use tch::{Kind, Tensor};

use crate::Metrics;

/// Metric name -> 0-dim f64 tensor (detached), on the device the loss ran on.
#[derive(Default)]
pub struct DeviceMetrics(BTreeMap<&'static str, Tensor>);

impl DeviceMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// `key` = the scalar tensor `t` (detached, not read).
    pub fn put(&mut self, key: &'static str, t: &Tensor) {
        self.0.insert(key, t.detach().to_kind(Kind::Double));
    }

    /// `key` = a number known on the host (on the CPU until read).
    pub fn put_value(&mut self, key: &'static str, v: f64) {
        self.0.insert(key, Tensor::from(v));
    }

    pub fn get(&self, key: &str) -> Option<&Tensor> {
        self.0.get(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &Tensor)> {
        self.0.iter().map(|(k, v)| (*k, v))
    }

    /// Every value on the host, in one copy per device (an exact zero reads as 0, not -0).
    pub fn read(&self) -> Metrics {
        let keys: Vec<&'static str> = self.0.keys().copied().collect();
        let values = read_all(&self.0.values().collect::<Vec<_>>());
        keys.into_iter().zip(values).collect()
    }
}

/// The values of 0-dim tensors on the host, in order: the ones on a GPU stacked and copied once.
pub fn read_all(ts: &[&Tensor]) -> Vec<f64> {
    let Some(device) = ts
        .iter()
        .map(|t| t.device())
        .find(|d| *d != tch::Device::Cpu)
    else {
        return ts.iter().map(|t| t.double_value(&[]) + 0.0).collect();
    };
    let on_device: Vec<Tensor> = ts
        .iter()
        .map(|t| t.to_device(device).to_kind(Kind::Double).reshape([1]))
        .collect();
    let host = Tensor::cat(&on_device, 0).to_device(tch::Device::Cpu);
    Vec::<f64>::try_from(host)
        .expect("a 1-D f64 tensor")
        .into_iter()
        .map(|v| v + 0.0)
        .collect()
}
