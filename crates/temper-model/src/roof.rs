//! The hardware's roof, measured on the spot, and the FLOPs a model's passes take, so that a
//! throughput is also read as a fraction of what the same cores or GPU reach.
//!
//! The roof is one large square matmul in the compute dtype (what the best-shaped work of a
//! training step could reach on this device with the current libtorch threads) and one large copy
//! (the memory bandwidth, which bounds decoding). FLOPs follow the usual MFU convention: 2 per
//! multiply-add of the model's matmuls; a training pass is three forwards' worth (the backward's
//! input and weight gradients) when every weight trains, two with LoRA (no base weight gradients);
//! recomputation (activation checkpointing) is not counted. A decode step is read against the
//! copy roof (the usual MBU convention): it reads every matmul weight once for all its rows, and
//! each row reads its keys and values.

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

/// What decode steps did, counted by the sampling engine: the work a decoding rate is read
/// against (prefill steps, compute-bound, are not counted here).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecodeWork {
    /// Decode steps (each one forward of every running row by one token).
    pub steps: u64,
    /// Tokens decoded (rows summed over steps).
    pub tokens: u64,
    /// Positions the decoded tokens attended to (each row's prompt and completion so far).
    pub attended: u64,
    /// Seconds the decode steps took, sampling and bookkeeping included.
    pub seconds: f64,
}

impl DecodeWork {
    /// The work of both.
    pub fn plus(self, other: DecodeWork) -> DecodeWork {
        DecodeWork {
            steps: self.steps + other.steps,
            tokens: self.tokens + other.tokens,
            attended: self.attended + other.attended,
            seconds: self.seconds + other.seconds,
        }
    }

    /// Bytes the steps read at least, for `config` with weights and cache in `compute`: every
    /// matmul weight once a step, every attended position's key and value once a token.
    pub fn bytes(&self, config: &ModelConfig, compute: ComputeKind) -> f64 {
        let elem = compute.kind().elt_size_in_bytes() as f64;
        let weights = (config.layer_matmul_params() + config.head_matmul_params()) as f64;
        let kv_per_position =
            2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim;
        elem * (weights * self.steps as f64 + kv_per_position as f64 * self.attended as f64)
    }

    /// FLOPs of the steps: the matmuls for every token, and the attention's two products
    /// (scores and the weighted values) over every attended position.
    pub fn flops(&self, config: &ModelConfig) -> f64 {
        let matmuls = 2.0
            * (config.layer_matmul_params() + config.head_matmul_params()) as f64
            * self.tokens as f64;
        let per_position =
            4 * config.num_hidden_layers * config.num_attention_heads * config.head_dim;
        matmuls + per_position as f64 * self.attended as f64
    }

    /// `perf/decode_*`: achieved TFLOP/s, GB/s, and the GB/s as a fraction of `roof`'s copy.
    pub fn metrics(
        &self,
        config: &ModelConfig,
        compute: ComputeKind,
        roof: &Roof,
    ) -> [(&'static str, f64); 3] {
        let secs = self.seconds.max(1e-9);
        let bytes_per_s = self.bytes(config, compute) / secs;
        [
            ("perf/decode_tflops", self.flops(config) / secs / 1e12),
            ("perf/decode_gb_per_s", bytes_per_s / 1e9),
            (
                "perf/decode_bandwidth_fraction",
                bytes_per_s / roof.copy_bytes,
            ),
        ]
    }
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
