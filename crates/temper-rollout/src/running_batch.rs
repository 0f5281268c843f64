//! The running batch of the engine: the rows being decoded, their KV cache and attention mask,
//! and how rows join (prefill, merged into the running cache) and leave (finished or abandoned).

use anyhow::Result;
use rand_chacha::ChaCha20Rng;
use tch::{Device, Kind, Tensor};
use temper_model::{CausalLm, KvCache, PaddedRows};

use crate::draw::sample_rng;
use crate::engine::Requests;
use crate::scheduler::Unit;

/// A sample being generated, aligned with a row of the cache.
pub(crate) struct Row {
    pub(crate) request: usize,
    pub(crate) sample: usize,
    pub(crate) completion: Vec<i64>,
    pub(crate) logprobs: Vec<f32>,
    /// Per completion token, the policy version that sampled it (kept only when the engine
    /// counts versions: [`crate::Engine::with_policy_version`]).
    pub(crate) versions: Vec<u64>,
    pub(crate) rng: ChaCha20Rng,
    /// Sorted unique ids of prompt + completion, kept only when a repetition penalty is set.
    pub(crate) seen: Vec<i64>,
}

/// The rows being decoded and the cache they decode against: [`Batch`] (a cache that grows and
/// shrinks with its rows, the CPU's) or [`crate::slot_batch::SlotBatch`] (fixed-shape slots, the
/// step captured as a CUDA graph).
pub(crate) trait RunningBatch {
    /// The rows, in the order of the logits the other methods return.
    fn rows(&self) -> &[Row];
    fn rows_mut(&mut self) -> &mut [Row];
    /// Admit `units`: returns next-token logits for every row (active rows first, then the new
    /// samples in unit order).
    fn rebuild(&mut self, model: &CausalLm, prepared: &Requests, units: &[Unit]) -> Result<Tensor>;
    /// One token per row; returns next-token logits.
    fn decode(&mut self, model: &CausalLm) -> Result<Tensor>;
    /// Keep only rows `keep` (ascending indices into `rows`).
    fn keep_rows(&mut self, model: &CausalLm, keep: &[i64]);
    /// Recompute every row's cache under `model`'s weights now ([`Batch::recompute`]).
    fn recompute(&mut self, model: &CausalLm, prepared: &Requests) -> Result<()>;
}

impl RunningBatch for Batch {
    fn rows(&self) -> &[Row] {
        &self.rows
    }
    fn rows_mut(&mut self) -> &mut [Row] {
        &mut self.rows
    }
    fn rebuild(&mut self, model: &CausalLm, prepared: &Requests, units: &[Unit]) -> Result<Tensor> {
        Batch::rebuild(self, model, prepared, units)
    }
    fn decode(&mut self, model: &CausalLm) -> Result<Tensor> {
        Ok(Batch::decode(self, model))
    }
    fn keep_rows(&mut self, _model: &CausalLm, keep: &[i64]) {
        Batch::keep_rows(self, keep)
    }
    fn recompute(&mut self, model: &CausalLm, prepared: &Requests) -> Result<()> {
        Batch::recompute(self, model, prepared);
        Ok(())
    }
}

/// Admitted prompts prefilled together, left-padded, one cache row per unit.
pub(crate) struct Prefilled {
    pub(crate) cache: KvCache,
    /// (units, V) next-token logits.
    pub(crate) logits: Tensor,
    /// (units, width) 0/1 padding mask.
    pub(crate) mask: Tensor,
    /// Left pads of each unit's row.
    pub(crate) pads: Vec<i64>,
    /// The unit (cache row) of each new sample row.
    pub(crate) source: Vec<i64>,
    /// The new rows, `count` per unit in unit order.
    pub(crate) rows: Vec<Row>,
}

/// Prefill `units`' prompts (left-padded, `room` positions reserved after the longest) and make
/// their samples' rows.
pub(crate) fn prefill_units(
    model: &CausalLm,
    prepared: &Requests,
    units: &[Unit],
    room: usize,
    device: Device,
) -> Prefilled {
    let seqs: Vec<&[i64]> = units
        .iter()
        .map(|u| prepared[&u.request].request.prompt_ids.as_slice())
        .collect();
    let (cache, mask, hidden, longest) = prefill_padded(model, &seqs, room, device);
    let logits = model.logits(&hidden.select(1, -1));
    let mut source: Vec<i64> = Vec::new();
    let mut rows = Vec::new();
    for (u, unit) in units.iter().enumerate() {
        source.extend(std::iter::repeat_n(u as i64, unit.count));
        let p = &prepared[&unit.request];
        let mut seen = Vec::new();
        if p.request.params.repetition_penalty != 1.0 {
            seen = p.request.prompt_ids.clone();
            seen.sort_unstable();
            seen.dedup();
        }
        for sample in unit.first_sample..unit.first_sample + unit.count {
            rows.push(Row {
                request: unit.request,
                sample,
                completion: Vec::new(),
                logprobs: Vec::new(),
                versions: Vec::new(),
                rng: sample_rng(p.seed, sample),
                seen: seen.clone(),
            });
        }
    }
    let pads = seqs.iter().map(|s| (longest - s.len()) as i64).collect();
    Prefilled {
        cache,
        logits,
        mask,
        pads,
        source,
        rows,
    }
}

/// `seqs` left-padded (pads are id 0, never attended) and run through `model` into a fresh
/// cache with `room` positions reserved after the longest: (the cache, the (rows, width) mask,
/// the final hidden states, the longest's length).
fn prefill_padded(
    model: &CausalLm,
    seqs: &[&[i64]],
    room: usize,
    device: Device,
) -> (KvCache, Tensor, Tensor, usize) {
    let rows: Vec<(&[i64], &[i64])> = seqs.iter().map(|s| (*s, &[][..])).collect();
    let padded = PaddedRows::new(&rows, 0);
    let longest = padded.prompt_width;
    let (ids, mask, pos) = padded.tensors(device);
    let mut cache = KvCache::with_capacity(model.num_layers(), (longest + room) as i64);
    let hidden = model.forward_hidden(&ids, &pos, &mask, Some(&mut cache));
    (cache, mask, hidden, longest)
}

/// The rows being decoded, their cache and attention mask.
pub(crate) struct Batch {
    pub(crate) rows: Vec<Row>,
    pub(crate) cache: Option<KvCache>,
    /// (rows, cache.len()) i64, 1 = real token.
    pub(crate) mask: Tensor,
    pub(crate) device: Device,
}

impl Batch {
    pub(crate) fn empty(device: Device) -> Self {
        Self {
            rows: Vec::new(),
            cache: None,
            mask: Tensor::zeros([0, 0], (Kind::Int64, device)),
            device,
        }
    }

    /// Admit `units`: returns next-token logits for every row (active rows first, then the new
    /// samples in unit order). With rows running, they take their due decode step, the admitted
    /// prompts are prefilled on their own, and the two caches are merged
    /// ([`KvCache::merge_rows`]); the running rows are never re-prefilled.
    pub(crate) fn rebuild(
        &mut self,
        model: &CausalLm,
        prepared: &Requests,
        units: &[Unit],
    ) -> Result<Tensor> {
        if self.rows.is_empty() {
            // Room for every row's tokens, so the cache never has to grow while decoding.
            let room = units
                .iter()
                .map(|u| prepared[&u.request].max_new)
                .max()
                .unwrap_or(0);
            return self.prefill(model, prepared, units, room);
        }
        let active_logits = self.decode(model);
        let mut fresh = Batch::empty(self.device);
        // No room reserved here: `merge_rows` allocates the merged cache with it.
        let new_logits = fresh.prefill(model, prepared, units, 0)?;
        let (old, new) = (
            self.cache.take().expect("running rows have a cache"),
            fresh.cache.take().expect("a prefill makes a cache"),
        );
        let len = old.len().max(new.len());
        // Room for every row's remaining tokens, so the cache never has to grow while decoding.
        let remaining = self
            .rows
            .iter()
            .chain(&fresh.rows)
            .map(|r| prepared[&r.request].max_new - r.completion.len())
            .max()
            .unwrap_or(0);
        self.cache = Some(KvCache::merge_rows(old, new, len + remaining as i64));
        let left_pad = |mask: &Tensor| {
            let (rows, width) = mask.size2().expect("mask is 2-D");
            let zeros = Tensor::zeros([rows, len - width], (Kind::Int64, self.device));
            Tensor::cat(&[&zeros, mask], 1)
        };
        self.mask = Tensor::cat(&[left_pad(&self.mask), left_pad(&fresh.mask)], 0);
        self.rows.append(&mut fresh.rows);
        Ok(Tensor::cat(&[active_logits, new_logits], 0))
    }

    /// Prefill the admitted prompts into a fresh cache (no rows running) with `room` positions
    /// reserved after the longest prompt, and repeat each prompt's row for its samples; returns
    /// their next-token logits.
    fn prefill(
        &mut self,
        model: &CausalLm,
        prepared: &Requests,
        units: &[Unit],
        room: usize,
    ) -> Result<Tensor> {
        debug_assert!(self.rows.is_empty());
        let p = prefill_units(model, prepared, units, room, self.device);
        let index = Tensor::from_slice(&p.source).to_device(self.device);
        let mut cache = p.cache;
        if units.iter().any(|u| u.count != 1) {
            cache.select_rows(&index);
        }
        self.mask = p.mask.index_select(0, &index);
        self.cache = Some(cache);
        self.rows = p.rows;
        Ok(p.logits.index_select(0, &index))
    }

    /// Recomputes every row's cache under `model`'s weights now: each row's prompt and its
    /// completion but the newest token (the next decode step feeds that one) as one
    /// left-padded prefill, with room for the longest remaining answer. The rows, their
    /// tokens and generators stay as they were.
    pub(crate) fn recompute(&mut self, model: &CausalLm, prepared: &Requests) {
        if self.rows.is_empty() {
            return;
        }
        let seqs: Vec<Vec<i64>> = self
            .rows
            .iter()
            .map(|r| {
                let mut seq = prepared[&r.request].request.prompt_ids.clone();
                seq.extend_from_slice(&r.completion[..r.completion.len().saturating_sub(1)]);
                seq
            })
            .collect();
        let seqs: Vec<&[i64]> = seqs.iter().map(Vec::as_slice).collect();
        let room = self
            .rows
            .iter()
            .map(|r| {
                prepared[&r.request]
                    .max_new
                    .saturating_sub(r.completion.len())
                    + 1
            })
            .max()
            .unwrap_or(1);
        let (cache, mask, _, _) = prefill_padded(model, &seqs, room, self.device);
        self.cache = Some(cache);
        self.mask = mask;
    }

    /// One token per row against the cache; returns next-token logits.
    pub(crate) fn decode(&mut self, model: &CausalLm) -> Tensor {
        let last: Vec<i64> = self
            .rows
            .iter()
            .map(|r| *r.completion.last().expect("decoded rows have a token"))
            .collect();
        let b = self.rows.len() as i64;
        let ids = Tensor::from_slice(&last)
            .to_device(self.device)
            .view([b, 1]);
        // Position of the newest token = number of real tokens before it.
        let pos = self
            .mask
            .sum_dim_intlist([1i64].as_slice(), true, Kind::Int64);
        self.mask = Tensor::cat(
            &[
                &self.mask,
                &Tensor::ones([b, 1], (Kind::Int64, self.device)),
            ],
            1,
        );
        let cache = self.cache.as_mut().expect("decoding needs a cache");
        let hidden = model.forward_hidden(&ids, &pos, &self.mask, Some(cache));
        model.logits(&hidden.select(1, -1))
    }

    /// Keep only rows `keep` (ascending indices into `rows`).
    pub(crate) fn keep_rows(&mut self, keep: &[i64]) {
        if keep.len() == self.rows.len() {
            return;
        }
        if keep.is_empty() {
            *self = Batch::empty(self.device);
            return;
        }
        let mut wanted = keep.iter().peekable();
        let mut i = 0i64;
        self.rows.retain(|_| {
            let k = wanted.next_if_eq(&&i).is_some();
            i += 1;
            k
        });
        let index = Tensor::from_slice(keep).to_device(self.device);
        if let Some(cache) = self.cache.as_mut() {
            cache.select_rows(&index);
        }
        self.mask = self.mask.index_select(0, &index);
        // Left padding every remaining row has (it was there for rows that have left, or the
        // rows joined a longer batch): attention need not read it any more.
        let width = self.mask.size()[1];
        let pad = i64::try_from(self.mask.argmax(1, false).min()).unwrap_or(0);
        if pad > 0 && pad < width {
            if let Some(cache) = self.cache.as_mut() {
                cache.drop_front(pad);
            }
            self.mask = self.mask.narrow(1, pad, width - pad);
        }
    }
}
