//! The running batch in fixed-shape slots ([`temper_model::static_decode`]): each row owns a
//! slot of the model's static cache, a decode step runs the smallest bucket (a power of two)
//! holding every owned slot, and on CUDA that step is a replayed graph.
//!
//! Rows join as the growing-cache batch's do (their prompts prefilled together, eagerly), then
//! are copied into free slots; a finished row frees its slot without moving anything. When the
//! rows left fit a smaller bucket, the ones in high slots move down, so steps shrink with the
//! batch. A row's position is its prompt length plus its completion so far, less one: where
//! its newest token goes.

use std::collections::HashSet;

use anyhow::Result;
use tch::{Device, Tensor};
use temper_model::static_decode::bucket_for;
use temper_model::CausalLm;

use crate::engine::Requests;
use crate::running_batch::{prefill_units, Row, RunningBatch};
use crate::scheduler::Unit;

pub(crate) struct SlotBatch {
    rows: Vec<Row>,
    /// Where each row lives, aligned with `rows`.
    places: Vec<Place>,
    /// Slots decoded per step: every owned slot is below it.
    bucket: usize,
    device: Device,
}

/// A row's slot and what its positions are counted from.
struct Place {
    slot: i64,
    prompt_len: i64,
    /// The row's token budget (its prompt plus `max_new`): the positions it may need.
    need: i64,
}

impl SlotBatch {
    pub(crate) fn new(device: Device) -> Self {
        SlotBatch {
            rows: Vec::new(),
            places: Vec::new(),
            bucket: 0,
            device,
        }
    }

    fn slots(&self) -> Vec<i64> {
        self.places.iter().map(|p| p.slot).collect()
    }
}

impl RunningBatch for SlotBatch {
    fn rows(&self) -> &[Row] {
        &self.rows
    }

    fn rows_mut(&mut self) -> &mut [Row] {
        &mut self.rows
    }

    fn rebuild(&mut self, model: &CausalLm, prepared: &Requests, units: &[Unit]) -> Result<Tensor> {
        // The running rows take their due step first (a copy: the next step rewrites it).
        let active = match self.rows.is_empty() {
            true => None,
            false => Some(self.decode(model)?.copy()),
        };
        let p = prefill_units(model, prepared, units, 0, self.device);
        let bucket = bucket_for(self.rows.len() + p.rows.len()).max(self.bucket);
        let owned: HashSet<i64> = self.places.iter().map(|p| p.slot).collect();
        let free: Vec<i64> = (0..bucket as i64)
            .filter(|s| !owned.contains(s))
            .take(p.rows.len())
            .collect();
        for (row, &slot) in p.rows.iter().zip(&free) {
            let prep = &prepared[&row.request];
            let prompt_len = prep.request.prompt_ids.len() as i64;
            self.places.push(Place {
                slot,
                prompt_len,
                need: prompt_len + prep.max_new as i64,
            });
        }
        let positions = self.places.iter().map(|p| p.need).max().unwrap_or(1);
        if active.is_none() {
            // No slot in use: buffers much larger than this batch needs are made smaller.
            model.static_decode_shrink(bucket, positions);
        }
        model.static_decode_reserve(bucket, positions);
        let pads: Vec<i64> = p.source.iter().map(|&u| p.pads[u as usize]).collect();
        model.static_decode_load(&p.cache, &p.source, &pads, &free);
        self.rows.extend(p.rows);
        self.bucket = bucket;
        let index = Tensor::from_slice(&p.source).to_device(self.device);
        let new_logits = p.logits.index_select(0, &index);
        Ok(match active {
            Some(a) => Tensor::cat(&[a, new_logits], 0),
            None => new_logits,
        })
    }

    fn decode(&mut self, model: &CausalLm) -> Result<Tensor> {
        let mut ids = vec![0i64; self.bucket];
        let mut positions = vec![0i64; self.bucket];
        for (row, place) in self.rows.iter().zip(&self.places) {
            let slot = place.slot as usize;
            ids[slot] = *row.completion.last().expect("decoded rows have a token");
            positions[slot] = place.prompt_len + row.completion.len() as i64 - 1;
        }
        let logits = model.static_decode_step(&ids, &positions)?;
        let in_order = self.rows.len() == self.bucket
            && self
                .places
                .iter()
                .enumerate()
                .all(|(i, p)| p.slot == i as i64);
        Ok(match in_order {
            true => logits,
            false => {
                logits.index_select(0, &Tensor::from_slice(&self.slots()).to_device(self.device))
            }
        })
    }

    fn recompute(&mut self, _model: &CausalLm, _prepared: &Requests) -> Result<()> {
        // The engine decodes with the growing cache when it recomputes (Engine::with_kv_recompute).
        anyhow::bail!(
            "recomputing the cache after new weights needs the growing decode, not fixed slots"
        )
    }

    fn keep_rows(&mut self, model: &CausalLm, keep: &[i64]) {
        if keep.len() == self.rows.len() {
            return;
        }
        let keep: HashSet<usize> = keep.iter().map(|&i| i as usize).collect();
        let (mut i, mut j) = (0, 0);
        self.rows.retain(|_| {
            i += 1;
            keep.contains(&(i - 1))
        });
        self.places.retain(|_| {
            j += 1;
            keep.contains(&(j - 1))
        });
        if self.rows.is_empty() {
            self.bucket = 0;
            return;
        }
        // Fewer rows: move those in slots at or above the smaller bucket into free slots below it.
        let want = bucket_for(self.rows.len());
        if want >= self.bucket {
            return;
        }
        let owned: HashSet<i64> = self.places.iter().map(|p| p.slot).collect();
        let mut free = (0..want as i64).filter(|s| !owned.contains(s));
        let (mut from, mut to) = (Vec::new(), Vec::new());
        for place in self.places.iter_mut().filter(|p| p.slot >= want as i64) {
            let target = free
                .next()
                .expect("a smaller bucket has room for every row");
            from.push(place.slot);
            to.push(target);
            place.slot = target;
        }
        if !from.is_empty() {
            model.static_decode_move(&from, &to);
        }
        self.bucket = want;
    }
}
