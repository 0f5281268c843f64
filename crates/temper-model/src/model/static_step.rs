//! The model's fixed-shape decode step ([`crate::static_decode`]): the engine reserves slots,
//! loads prefilled rows into them, and steps them a bucket at a time.
use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};

use super::{CausalLm, LayerContext};
use crate::static_decode::{bucket_for, capacity_for, DecodeCounts, KvShape, StaticDecoder};
use crate::KvCache;

impl CausalLm {
    /// Room for `rows` slots (rounded up to a bucket) of `positions` each (rounded up by
    /// [`capacity_for`]), keeping what the slots hold. The decoder and its graphs are kept across
    /// sampling calls; captured steps whose weights moved since are dropped here.
    pub fn static_decode_reserve(&self, rows: usize, positions: i64) {
        let rows = bucket_for(rows) as i64;
        let capacity = capacity_for(positions);
        let fingerprint = self.static_fingerprint();
        let mut slot = self.static_decoder.borrow_mut();
        let dec = slot.get_or_insert_with(|| {
            let shape = KvShape {
                layers: self.layers.len(),
                kv_heads: self.config.num_key_value_heads,
                head_dim: self.config.head_dim,
                kind: self.compute.kind(),
                device: self.device(),
            };
            StaticDecoder::new(shape, rows, capacity)
        });
        dec.reserve(rows, capacity);
        if dec.fingerprint != fingerprint {
            dec.drop_graphs();
            dec.fingerprint = fingerprint;
        }
    }

    /// With no slot in use (a sampling call starting): buffers sized for `rows` slots of
    /// `positions` each when the ones held are at least twice that, so that one long request
    /// does not make every later step attend over its capacity. Call before
    /// [`CausalLm::static_decode_reserve`].
    pub fn static_decode_shrink(&self, rows: usize, positions: i64) {
        let rows = bucket_for(rows) as i64;
        let capacity = capacity_for(positions);
        if let Some(dec) = self.static_decoder.borrow_mut().as_mut() {
            dec.shrink_to(rows, capacity);
        }
    }

    /// How this model's fixed-shape decode steps ran so far (zeros before any).
    pub fn static_decode_counts(&self) -> DecodeCounts {
        self.static_decoder
            .borrow()
            .as_ref()
            .map_or_else(DecodeCounts::default, |d| d.counts())
    }

    /// The slots and positions reserved, `(0, 0)` before any.
    pub fn static_decode_room(&self) -> (usize, i64) {
        self.static_decoder
            .borrow()
            .as_ref()
            .map_or((0, 0), |d| (d.rows() as usize, d.capacity()))
    }

    /// Copies prefilled rows into slots: slot `slots[j]` gets row `source[j]` of the left-padded
    /// prefill `cache`, without its `pads[j]` leading pads.
    pub fn static_decode_load(&self, cache: &KvCache, source: &[i64], pads: &[i64], slots: &[i64]) {
        let dec = self.static_decoder.borrow();
        let dec = dec.as_ref().expect("static_decode_reserve first");
        tch::no_grad(|| dec.load(cache, source, pads, slots));
    }

    /// Moves slot `from[j]` to `to[j]` (rows gathered into a smaller bucket).
    pub fn static_decode_move(&self, from: &[i64], to: &[i64]) {
        let dec = self.static_decoder.borrow();
        let dec = dec.as_ref().expect("static_decode_reserve first");
        tch::no_grad(|| dec.move_slots(from, to));
    }

    /// One decode step of slots `0..ids.len()` (a bucket): slot `r` feeds token `ids[r]` at
    /// position `positions[r]` (its tokens before it). Returns next-token logits (bucket, V) f32;
    /// on CUDA they are the captured graph's output, rewritten by the next step, so read them
    /// first.
    pub fn static_decode_step(&self, ids: &[i64], positions: &[i64]) -> Result<Tensor> {
        let b = ids.len();
        if b != positions.len() || b != bucket_for(b) {
            bail!(
                "a static decode step takes a bucket of ids and positions, got {b} and {}",
                positions.len()
            );
        }
        let mut slot = self.static_decoder.borrow_mut();
        let Some(dec) = slot.as_mut() else {
            bail!("static_decode_reserve first");
        };
        if b as i64 > dec.rows() {
            bail!("{b} slots asked, {} reserved", dec.rows());
        }
        let host: Vec<i64> = ids.iter().chain(positions).copied().collect();
        let b = b as i64;
        let _no_grad = tch::no_grad_guard();
        dec.inputs.narrow(1, 0, b).copy_(
            &Tensor::from_slice(&host)
                .view([2, b])
                .to_device(self.device()),
        );
        dec.run(b, &|d| self.forward_static(d, b))
    }

    /// How many buckets have a captured CUDA graph.
    pub fn static_decode_captured(&self) -> usize {
        self.static_decoder
            .borrow()
            .as_ref()
            .map_or(0, |d| d.captured())
    }

    /// Frees the fixed-shape decoder: its cache and graphs.
    pub fn release_static_decoder(&self) {
        *self.static_decoder.borrow_mut() = None;
    }

    /// The step itself, on the decoder's inputs: only tensor ops, nothing read to the host.
    fn forward_static(&self, dec: &StaticDecoder, b: i64) -> Tensor {
        let c = &self.config;
        let kind = self.compute.kind();
        let device = self.device();
        let capacity = dec.capacity();
        let ids = dec.inputs.get(0).narrow(0, 0, b).view([b, 1]);
        // A slot past its capacity (a free slot's garbage) writes the last position.
        let pos = dec.inputs.get(1).narrow(0, 0, b).clamp(0, capacity - 1);
        let index = pos
            .view([b, 1, 1, 1])
            .expand([b, c.num_key_value_heads, 1, c.head_dim], false)
            .contiguous();
        let keys = Tensor::arange(capacity, (Kind::Int64, device)).view([1, capacity]);
        let bias = Tensor::zeros([b, capacity], (Kind::Float, device))
            .masked_fill(&keys.gt_tensor(&pos.view([b, 1])), f64::NEG_INFINITY);
        let (cos, sin) = self.rope.cos_sin(&pos.view([b, 1]), kind);
        let ctx = LayerContext {
            b,
            t: 1,
            cos: &cos,
            sin: &sin,
            mask: &bias,
            decode_bias: Some(&bias),
            cached_attention: device == Device::Cpu,
            fixed: Some((&dec.kv, &index)),
        };
        let sampling = self.sampling.borrow();
        let mut h = self.embed(&ids, false);
        for i in 0..self.layers.len() {
            let frozen = sampling.as_ref().map(|s| &s.layers[i]);
            if frozen.is_none() {
                self.fetch_layer(i);
            }
            h = self.layer(i, h, &ctx, frozen, None, None, None);
            if frozen.is_none() {
                self.release_layer_after_forward(i);
            }
        }
        self.logits(&self.final_norm(&h).select(1, -1))
    }

    /// Where every tensor the step reads lives: parameters (LoRA's too), the sampling copies,
    /// RoPE's frequencies.
    fn static_fingerprint(&self) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .named_parameters()
            .iter()
            .map(|(_, t)| t.data_ptr() as usize)
            .collect();
        let mut read = vec![&self.embed_tokens, &self.norm];
        read.extend(&self.lm_head);
        for l in &self.layers {
            read.extend([&l.input_layernorm, &l.post_attention_layernorm]);
            read.extend(l.q_norm.iter().chain(&l.k_norm));
        }
        out.extend(read.iter().map(|t| t.data_ptr() as usize));
        if let Some((_, store)) = &self.lora {
            out.extend(
                store
                    .trainable_variables()
                    .iter()
                    .map(|t| t.data_ptr() as usize),
            );
        }
        if let Some(s) = self.sampling.borrow().as_ref() {
            out.extend(s.tensors().into_iter().map(|t| t.data_ptr() as usize));
        }
        out.push(self.rope.inv_freq().data_ptr() as usize);
        out
    }
}
