//! The decode step at fixed shapes, so that it can be captured once as a CUDA graph and replayed
//! for every token ([`crate::CausalLm::static_decode_step`]).
//!
//! The growing cache of [`crate::KvCache`] changes its shapes every token (the attended length,
//! the mask's width), and a batch changes its row count as rows finish, so nothing of it can be
//! captured. Here every shape is fixed:
//! - the K/V buffers hold `rows` slots of `capacity` positions each, in the compute dtype, for
//!   the batch's longest row; slot `r` holds its row's positions `0..len` left-aligned (no
//!   padding), so a row's position is also where its next key goes;
//! - a step decodes the first `bucket` slots, `bucket` a power of two (1, 2, 4, ..., 256, ...): a
//!   batch of 5 rows runs the 8-slot step, the other 3 slots computing nothing anyone reads;
//! - the inputs are one (2, rows) i64 tensor written in place before each step: each slot's
//!   newest token and its position. Inside the step the position picks the slot to write
//!   (`scatter_`), RoPE's angle and the attended keys (`position >= key index`, an additive
//!   bias over the whole capacity).
//!
//! On CUDA each bucket's step is captured once (libtorch's `at::cuda::CUDAGraph`, all buckets
//! sharing one memory pool) and replayed per token; the first step of a bucket runs eagerly and
//! captures the next. A capture that fails prints a warning each time; the pool is reset and the
//! next step of the bucket tries again, and after [`CAPTURE_TRIES`] failures in a row the decoder
//! steps eagerly until its buffers or weights change. Replays and eager steps are counted
//! ([`DecodeCounts`], the trainer's `rollout/graph_replays` and `rollout/eager_steps`). On the CPU
//! the same step runs uncaptured. Attending over the whole capacity costs more than over the
//! filled positions, but a fixed shape is what a graph needs, and on a GPU a decode step is
//! bound by launches and weights, not by these reads.

use std::collections::HashMap;

use anyhow::Result;
use tch::{Device, Kind, Tensor};
use temper_kernels::graph::{CudaGraph, GraphPool};

use crate::KvCache;

/// Positions per slot for `positions` (at least one), rounded up to [`CAPACITY_STEP`].
pub fn capacity_for(positions: i64) -> i64 {
    (positions.max(1) as u64).div_ceil(CAPACITY_STEP as u64) as i64 * CAPACITY_STEP
}

/// The bucket (slots decoded together) for `rows` live rows: the next power of two.
pub fn bucket_for(rows: usize) -> usize {
    rows.max(1).next_power_of_two()
}

/// Capacities are whole multiples of this many positions, so that a longer row seldom forces a
/// new cache (and new graphs).
pub const CAPACITY_STEP: i64 = 256;

/// What every layer's K and V buffer holds besides its rows and positions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KvShape {
    pub(crate) layers: usize,
    pub(crate) kv_heads: i64,
    pub(crate) head_dim: i64,
    pub(crate) kind: Kind,
    pub(crate) device: Device,
}

/// Per-layer K and V buffers of shape (rows, n_kv_heads, capacity, head_dim).
#[derive(Debug)]
pub(crate) struct StaticKv {
    layers: Vec<(Tensor, Tensor)>,
    shape: KvShape,
    rows: i64,
    capacity: i64,
}

impl StaticKv {
    fn new(shape: KvShape, rows: i64, capacity: i64) -> Self {
        let zeros = || {
            Tensor::zeros(
                [rows, shape.kv_heads, capacity, shape.head_dim],
                (shape.kind, shape.device),
            )
        };
        StaticKv {
            layers: (0..shape.layers).map(|_| (zeros(), zeros())).collect(),
            shape,
            rows,
            capacity,
        }
    }

    /// A larger cache holding this one's contents in its first slots and positions.
    fn grown(&self, rows: i64, capacity: i64) -> Self {
        let out = Self::new(self.shape, rows, capacity);
        for ((k, v), (nk, nv)) in self.layers.iter().zip(&out.layers) {
            for (old, new) in [(k, nk), (v, nv)] {
                new.narrow(0, 0, self.rows)
                    .narrow(2, 0, self.capacity)
                    .copy_(old);
            }
        }
        out
    }

    /// Write layer `layer`'s new keys and values (B, n_kv, 1, d) at each slot's position
    /// (`index`: the positions broadcast to (B, n_kv, 1, d)); returns the first B slots' whole
    /// buffers.
    pub(crate) fn write(
        &self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        index: &Tensor,
    ) -> (Tensor, Tensor) {
        let b = k.size()[0];
        let (kb, vb) = &self.layers[layer];
        let (mut kb, mut vb) = (kb.narrow(0, 0, b), vb.narrow(0, 0, b));
        let _ = kb.scatter_(2, index, k);
        let _ = vb.scatter_(2, index, v);
        (kb, vb)
    }

    /// Rows of a left-padded prefill `cache` into slots: slot `slots[j]` gets row `source[j]`'s
    /// real positions (those after its `pads[j]` pads) at positions `0..`, left-aligned.
    fn load(&self, cache: &KvCache, source: &Tensor, pads: &Tensor, slots: &Tensor) {
        let width = cache.len();
        let m = source.size()[0];
        // Position j of slot j's row is the prefill's position j + pads[j]: one index for every
        // layer's keys and values.
        let at = (Tensor::arange(width, (Kind::Int64, self.shape.device)).view([1, 1, width, 1])
            + pads.view([m, 1, 1, 1]))
        .clamp_max(width - 1)
        .expand([m, self.shape.kv_heads, width, self.shape.head_dim], false);
        for (layer, (kb, vb)) in self.layers.iter().enumerate() {
            let (k, v) = cache.layer(layer).expect("a prefilled cache");
            for (from, to) in [(k, kb), (v, vb)] {
                let rows = from.narrow(2, 0, width).index_select(0, source);
                let aligned = rows.gather(2, &at, false);
                let _ = to.narrow(2, 0, width).index_copy_(0, slots, &aligned);
            }
        }
    }

    /// Moves slots `from[j]` to `to[j]` (a batch shrinking to a smaller bucket).
    fn move_slots(&self, from: &Tensor, to: &Tensor) {
        for (kb, vb) in &self.layers {
            for buf in [kb, vb] {
                let moved = buf.index_select(0, from);
                let _ = buf.shallow_clone().index_copy_(0, to, &moved);
            }
        }
    }
}

/// Failed captures in a row after which the decoder stops trying until its buffers or weights
/// change.
pub const CAPTURE_TRIES: u32 = 2;

/// How a decoder's steps ran since it was made: replayed CUDA graphs, eager steps (every step on
/// the CPU, a bucket's first step, or every step once captures failed), failed captures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeCounts {
    pub graph_replays: u64,
    pub eager_steps: u64,
    pub failed_captures: u64,
}

/// One bucket's captured step and the logits each replay rewrites.
#[derive(Debug)]
struct Captured {
    graph: CudaGraph,
    logits: Tensor,
}

/// A model's fixed-shape decoder: the cache, the inputs, and on CUDA the captured steps.
#[derive(Debug)]
pub(crate) struct StaticDecoder {
    pub(crate) kv: StaticKv,
    /// (2, rows) i64: row 0 the slots' newest token ids, row 1 their positions.
    pub(crate) inputs: Tensor,
    graphs: HashMap<i64, Captured>,
    pool: Option<GraphPool>,
    /// Where every tensor the step reads lived when the graphs were captured: a graph reads
    /// those addresses, so a weight that moved (a reload, new sampling copies) drops them.
    pub(crate) fingerprint: Vec<usize>,
    /// Not captured here: the CPU, a CPU build, or `TEMPER_CUDA_GRAPHS=0`.
    eager_only: bool,
    /// Captures that failed since the last success or since the buffers changed; at
    /// [`CAPTURE_TRIES`] the steps stay eager until [`StaticDecoder::drop_graphs`].
    failures_in_a_row: u32,
    counts: DecodeCounts,
}

impl StaticDecoder {
    pub(crate) fn new(shape: KvShape, rows: i64, capacity: i64) -> Self {
        StaticDecoder {
            kv: StaticKv::new(shape, rows, capacity),
            inputs: Tensor::zeros([2, rows], (Kind::Int64, shape.device)),
            graphs: HashMap::new(),
            pool: None,
            fingerprint: Vec::new(),
            eager_only: !captures_on(shape.device),
            failures_in_a_row: 0,
            counts: DecodeCounts::default(),
        }
    }

    pub(crate) fn rows(&self) -> i64 {
        self.kv.rows
    }

    pub(crate) fn capacity(&self) -> i64 {
        self.kv.capacity
    }

    /// Room for `rows` slots of `capacity` positions, keeping what is cached; new buffers drop
    /// the graphs that read the old ones.
    pub(crate) fn reserve(&mut self, rows: i64, capacity: i64) {
        if rows <= self.kv.rows && capacity <= self.kv.capacity {
            return;
        }
        self.grow(rows.max(self.kv.rows), capacity.max(self.kv.capacity));
    }

    /// With no slot in use: buffers of `rows` slots and `capacity` positions when the ones held
    /// are at least twice what that needs (in slots or positions), so that one long request does
    /// not make every later step attend over its capacity. Nothing cached is kept.
    pub(crate) fn shrink_to(&mut self, rows: i64, capacity: i64) {
        if self.kv.rows < 2 * rows && self.kv.capacity < 2 * capacity {
            return;
        }
        self.kv = StaticKv::new(self.kv.shape, rows, capacity);
        self.inputs = Tensor::zeros([2, rows], (Kind::Int64, self.inputs.device()));
        self.drop_graphs();
    }

    fn grow(&mut self, rows: i64, capacity: i64) {
        self.kv = self.kv.grown(rows, capacity);
        // Every step writes its slots' inputs first: nothing of the old ones is kept.
        self.inputs = Tensor::zeros([2, rows], (Kind::Int64, self.inputs.device()));
        self.drop_graphs();
    }

    /// Forget the captured steps (the buffers or weights they read moved), and their memory
    /// pool: libtorch refuses to capture into a pool whose graphs are all gone, so the next
    /// captures start a new one.
    pub(crate) fn drop_graphs(&mut self) {
        self.graphs.clear();
        self.pool = None;
        self.failures_in_a_row = 0;
    }

    pub(crate) fn counts(&self) -> DecodeCounts {
        self.counts
    }

    pub(crate) fn load(&self, cache: &KvCache, source: &[i64], pads: &[i64], slots: &[i64]) {
        let device = self.inputs.device();
        let t = |x: &[i64]| Tensor::from_slice(x).to_device(device);
        self.kv.load(cache, &t(source), &t(pads), &t(slots));
    }

    pub(crate) fn move_slots(&self, from: &[i64], to: &[i64]) {
        let device = self.inputs.device();
        let t = |x: &[i64]| Tensor::from_slice(x).to_device(device);
        self.kv.move_slots(&t(from), &t(to));
    }

    /// Runs the step of `bucket` slots (`eager` computes it; the inputs are already written):
    /// replays its graph where one is captured, else runs it eagerly and, on CUDA, captures it
    /// for the next time.
    pub(crate) fn run(
        &mut self,
        bucket: i64,
        eager: &dyn Fn(&StaticDecoder) -> Tensor,
    ) -> Result<Tensor> {
        if let Some(c) = self.graphs.get(&bucket) {
            c.graph.replay()?;
            self.counts.graph_replays += 1;
            return Ok(c.logits.shallow_clone());
        }
        let logits = eager(self);
        self.counts.eager_steps += 1;
        if self.eager_only || self.failures_in_a_row >= CAPTURE_TRIES {
            return Ok(logits);
        }
        let Device::Cuda(index) = self.inputs.device() else {
            unreachable!("captures on CUDA only")
        };
        let pool = match self.pool {
            Some(p) => Ok(p),
            None => GraphPool::new().inspect(|p| self.pool = Some(*p)),
        };
        match pool.and_then(|pool| CudaGraph::capture(index, pool, || eager(self))) {
            Ok((graph, captured)) => {
                self.failures_in_a_row = 0;
                self.graphs.insert(
                    bucket,
                    Captured {
                        graph,
                        logits: captured,
                    },
                );
            }
            Err(e) => {
                // The failed capture may have left the pool unusable: the retry captures into a
                // new one (the graphs already captured keep theirs).
                self.pool = None;
                self.failures_in_a_row += 1;
                self.counts.failed_captures += 1;
                let then = if self.failures_in_a_row >= CAPTURE_TRIES {
                    "eager steps until the decoder's buffers or weights change"
                } else {
                    "retrying at the bucket's next step with a new memory pool"
                };
                eprintln!(
                    "warning: capturing the {bucket}-slot decode step as a CUDA graph failed \
                     ({} in a row): {e:#}; {then}",
                    self.failures_in_a_row
                );
            }
        }
        Ok(logits)
    }

    /// How many buckets have a captured step (for reports and tests).
    pub(crate) fn captured(&self) -> usize {
        self.graphs.len()
    }
}

/// Whether steps on `device` are captured: CUDA, a CUDA build, and not `TEMPER_CUDA_GRAPHS=0`.
pub(crate) fn captures_on(device: Device) -> bool {
    matches!(device, Device::Cuda(_))
        && temper_kernels::graph::graphs_available()
        && std::env::var("TEMPER_CUDA_GRAPHS").map_or(true, |v| v != "0")
}
