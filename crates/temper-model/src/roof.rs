//! The hardware's roof, measured on the spot, and the FLOPs a model's passes take, so that a
//! throughput is also read as a fraction of what the same cores or GPU reach.
//!
//! The roof is one large square matmul in the compute dtype (what the best-shaped work of a
//! training step could reach on this device with the current libtorch threads) and one large copy
//! (the memory bandwidth, which bounds decoding). FLOPs follow the usual MFU convention: 2 per
//! multiply-add of the model's matmuls; a training pass is three forwards' worth (the backward's
//! input and weight gradients) when every weight trains, two with LoRA (no base weight gradients);
//! recomputation (activation checkpointing) is not counted.

use std::time::Instant;

use tch::{Device, Kind, Tensor};

use crate::{ComputeKind, ModelConfig};

/// What one device reaches, measured by [`Roof::measure`].
#[derive(Clone, Copy, Debug)]
pub struct Roof {
    /// FLOP/s of one `n x n x n` matmul in the compute dtype.
    pub matmul_flops: f64,
    /// The matmul's side.
    pub matmul_n: i64,
    /// Bytes/s of a large device-to-device copy (bytes read plus bytes written).
    pub copy_bytes: f64,
}

impl Roof {
    /// Times the matmul (2048 on a CPU, 8192 on a GPU) and a copy (64 MiB on a CPU, 256 MiB on a
    /// GPU: past their caches) on `device`, each at its best of a few runs after a warm-up: about
    /// 0.3 s on 2 CPU cores, milliseconds on a GPU. On a GPU the allocator's peak is reset after,
    /// so that `perf/max_memory_allocated_gb` does not count these buffers.
    pub fn measure(compute: ComputeKind, device: Device) -> Roof {
        let _no_grad = tch::no_grad_guard();
        let kind = compute.kind();
        let (n, elems, runs) = match device {
            Device::Cpu => (2048, 16 << 20, 3),
            _ => (8192, 64 << 20, 10),
        };
        // Fixed values, not random ones: the run's random stream must not depend on this.
        let a = Tensor::full([n, n], 0.5, (kind, device));
        let b = Tensor::full([n, n], 0.25, (kind, device));
        let secs = best_of(device, runs, || {
            let _ = a.matmul(&b);
        });
        let matmul_flops = 2.0 * (n as f64).powi(3) / secs;
        let src = Tensor::ones([elems], (Kind::Float, device));
        let mut dst = Tensor::empty([elems], (Kind::Float, device));
        let secs = best_of(device, runs, || {
            dst.copy_(&src);
        });
        drop((a, b, src, dst));
        if let Device::Cuda(i) = device {
            temper_kernels::memory::reset_cuda_peak(i);
        }
        Roof {
            matmul_flops,
            matmul_n: n,
            copy_bytes: 2.0 * 4.0 * elems as f64 / secs,
        }
    }

    /// One line for logs: "matmul roof 0.29 TFLOP/s (one 2048^3 f32 matmul), copy 21 GB/s".
    pub fn describe(&self, compute: ComputeKind) -> String {
        format!(
            "matmul roof {:.2} TFLOP/s (one {n}^3 {compute} matmul), copy {:.0} GB/s",
            self.matmul_flops / 1e12,
            self.copy_bytes / 1e9,
            n = self.matmul_n,
        )
    }
}

/// The best time of `runs` calls of `f` after one untimed call, synchronising a GPU around each.
fn best_of(device: Device, runs: usize, mut f: impl FnMut()) -> f64 {
    let sync = || {
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    f();
    sync();
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        let t = Instant::now();
        f();
        sync();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best.max(1e-12)
}

impl ModelConfig {
    /// Weights of the decoder layers' matmuls (attention and MLP projections, all layers).
    pub fn layer_matmul_params(&self) -> i64 {
        let h = self.hidden_size;
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let attention = h * q + 2 * h * kv + q * h;
        let mlp = 3 * h * self.intermediate_size;
        self.num_hidden_layers * (attention + mlp)
    }

    /// Weights of the output head (vocabulary x hidden).
    pub fn head_matmul_params(&self) -> i64 {
        self.vocab_size * self.hidden_size
    }

    /// FLOPs of one training pass (forward and backward): the decoder layers over `tokens`
    /// positions and the head over `scored` of them (those whose next-token scores the loss
    /// reads), three forwards' worth when every weight trains (`full`), two with LoRA.
    pub fn training_flops(&self, tokens: f64, scored: f64, full: bool) -> f64 {
        let forward = 2.0
            * (self.layer_matmul_params() as f64 * tokens
                + self.head_matmul_params() as f64 * scored);
        forward * if full { 3.0 } else { 2.0 }
    }
}
