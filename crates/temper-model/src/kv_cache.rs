//! Key/value cache for incremental decoding.
//!
//! Per layer, K and V live in a preallocated buffer of shape (B, n_kv_heads, capacity, head_dim) in
//! the model's compute dtype; a forward with T new tokens writes them at positions `len..len+T` and
//! attends over the view `0..len+T`. Growing doubles the capacity, so decoding does not copy the whole
//! cache at every step. The attention mask passed to [`crate::CausalLm::forward`] always covers all
//! `len + T` positions; rows may hold padding anywhere (masked keys are never attended to).
//!
//! Use it under `tch::no_grad` (the buffers are written in place).

use tch::{Kind, Tensor};

/// Per-layer K/V buffers plus the number of filled positions.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: i64,
    /// Capacity to allocate on first use (positions); grows by doubling afterwards.
    initial_capacity: i64,
}

impl KvCache {
    /// An empty cache for a model with `num_layers` layers.
    pub fn new(num_layers: usize) -> Self {
        Self::with_capacity(num_layers, 0)
    }

    /// An empty cache that reserves room for `capacity` positions at the first forward (e.g. prompt
    /// length + max new tokens), so that it never has to grow.
    pub fn with_capacity(num_layers: usize, capacity: i64) -> Self {
        KvCache {
            layers: (0..num_layers).map(|_| None).collect(),
            len: 0,
            initial_capacity: capacity,
        }
    }

    /// Number of cached positions (S_past).
    pub fn len(&self) -> i64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of rows (B), or None before the first forward.
    pub fn batch_size(&self) -> Option<i64> {
        self.layers
            .iter()
            .flatten()
            .next()
            .map(|(k, _)| k.size()[0])
    }

    /// The element type the cache holds (the compute dtype of the model that filled it), or None
    /// before the first forward.
    pub fn kind(&self) -> Option<Kind> {
        self.layers.iter().flatten().next().map(|(k, _)| k.kind())
    }

    /// Keep only the rows in `rows` (an i64 index tensor, repeats allowed): `[0,0,0,1,1,1]` turns one
    /// prefill of two prompts into three samples each; dropping finished rows shrinks the batch.
    /// The attention mask the caller keeps must be re-indexed the same way.
    pub fn select_rows(&mut self, rows: &Tensor) {
        for (k, v) in self.layers.iter_mut().flatten() {
            let idx = rows.to_device(k.device());
            *k = k.index_select(0, &idx);
            *v = v.index_select(0, &idx);
        }
    }

    /// The rows of `a` followed by the rows of `b` in one cache, right-aligned: the merged length is
    /// `max(a.len, b.len)` and each row's cached positions end there, so the shorter cache's rows
    /// gain empty slots on the left. The caller left-pads those rows' attention masks with the same
    /// number of zeros. Keys carry their rotary positions, so moving a row's slots does not change
    /// what it computes (every query attends by mask, not by slot). `capacity` (at least the merged
    /// length) reserves room for decoding. Both caches must come from the same model and hold at
    /// least one forward. They are consumed a layer at a time, so the merge holds one layer's
    /// old buffers beside the merged cache, not two whole caches.
    pub fn merge_rows(a: KvCache, b: KvCache, capacity: i64) -> KvCache {
        assert_eq!(a.layers.len(), b.layers.len(), "caches of different models");
        let len = a.len.max(b.len);
        let capacity = capacity.max(len);
        let (a_len, b_len) = (a.len, b.len);
        let layers = a
            .layers
            .into_iter()
            .zip(b.layers)
            .map(|(la, lb)| {
                let (ka, va) = la.expect("merge_rows: empty cache");
                let (kb, vb) = lb.expect("merge_rows: empty cache");
                let [rows_a, h, _, d] = ka.size()[..] else {
                    unreachable!("K is 4-D")
                };
                let rows_b = kb.size()[0];
                let opts = (ka.kind(), ka.device());
                let merged = |xa: Tensor, xb: Tensor| {
                    let out = Tensor::zeros([rows_a + rows_b, h, capacity, d], opts);
                    out.narrow(0, 0, rows_a)
                        .narrow(2, len - a_len, a_len)
                        .copy_(&xa.narrow(2, 0, a_len));
                    out.narrow(0, rows_a, rows_b)
                        .narrow(2, len - b_len, b_len)
                        .copy_(&xb.narrow(2, 0, b_len));
                    out
                };
                Some((merged(ka, kb), merged(va, vb)))
            })
            .collect();
        KvCache {
            layers,
            len,
            initial_capacity: capacity,
        }
    }

    /// Forget the first `n` positions of every row (the caller narrows its attention mask the
    /// same way): when every remaining row has at least `n` padding slots on the left (its rows
    /// joined later, or the rows that needed the room have left), attention stops reading them. A
    /// view of the same buffers: nothing is copied.
    pub fn drop_front(&mut self, n: i64) {
        assert!(
            (0..=self.len).contains(&n),
            "drop_front({n}) of {} positions",
            self.len
        );
        if n == 0 {
            return;
        }
        for (k, v) in self.layers.iter_mut().flatten() {
            let cap = k.size()[2];
            *k = k.narrow(2, n, cap - n);
            *v = v.narrow(2, n, cap - n);
        }
        self.len -= n;
        self.initial_capacity = (self.initial_capacity - n).max(0);
    }

    /// Drop every position (keeps nothing allocated).
    pub fn clear(&mut self) {
        for l in self.layers.iter_mut() {
            *l = None;
        }
        self.len = 0;
    }

    /// Write this layer's new K and V (B, n_kv, T, d) after the cached positions and return views of
    /// all `len + T` positions.
    pub(crate) fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let t = k.size()[2];
        let needed = self.len + t;
        let slot = &mut self.layers[layer];
        let grow = match slot {
            None => true,
            Some((kb, _)) => kb.size()[2] < needed,
        };
        if grow {
            let [b, h, _, d] = k.size()[..] else {
                unreachable!("K is 4-D")
            };
            let old_cap = slot.as_ref().map_or(0, |(kb, _)| kb.size()[2]);
            let cap = needed.max(2 * old_cap).max(self.initial_capacity);
            let kind: Kind = k.kind();
            let kb = Tensor::zeros([b, h, cap, d], (kind, k.device()));
            let vb = Tensor::zeros([b, h, cap, d], (kind, k.device()));
            if let Some((ok, ov)) = slot.as_ref() {
                kb.narrow(2, 0, self.len).copy_(&ok.narrow(2, 0, self.len));
                vb.narrow(2, 0, self.len).copy_(&ov.narrow(2, 0, self.len));
            }
            *slot = Some((kb, vb));
        }
        let (kb, vb) = slot.as_mut().expect("allocated above");
        kb.narrow(2, self.len, t).copy_(k);
        vb.narrow(2, self.len, t).copy_(v);
        (kb.narrow(2, 0, needed), vb.narrow(2, 0, needed))
    }

    /// Layer `layer`'s K and V buffers (B, n_kv, capacity, d), None before the first forward.
    pub(crate) fn layer(&self, layer: usize) -> Option<(&Tensor, &Tensor)> {
        self.layers[layer].as_ref().map(|(k, v)| (k, v))
    }

    /// Called once per forward, after every layer appended `t` positions.
    pub(crate) fn advance(&mut self, t: i64) {
        self.len += t;
    }
}
