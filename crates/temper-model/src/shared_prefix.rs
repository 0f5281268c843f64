//! Shared-prefix training forwards. The n samples of a GRPO group share their prompt: the prompt
//! runs once per group, and each sample's response attends to the group's keys and values, which
//! are gathered to the sample's row with `index_select`. Its backward is an `index_add`, so the
//! prompt's activations receive the sum of the responses' gradients: the same parameter gradients
//! as running every row in full, to float rounding (tested against the unshared forward).
//!
//! Cost: the prompt positions of a group's n rows are computed once instead of n times, in the
//! forward and the backward (and in the no-grad old / reference passes).

use tch::Tensor;

use crate::model::{CausalLm, Mask, PastKv};

/// The prompts and responses of some rows, with each row's prompt given by reference to a shared
/// one. Prompts are left-padded to one length `P`, responses right-padded to one length `R`.
pub struct SharedPrefixRows<'a> {
    /// (G, P) i64 ids, (G, P) 0/1 mask and (G, P) positions of the distinct prompts.
    pub prompt_ids: &'a Tensor,
    pub prompt_mask: &'a Tensor,
    pub prompt_positions: &'a Tensor,
    /// (B,) i64: row b's prompt is prompt `prompt_of_row[b]`.
    pub prompt_of_row: &'a Tensor,
    /// (B, R) i64 ids, (B, R) 0/1 mask and (B, R) positions (continuing the prompt's) of the
    /// responses.
    pub response_ids: &'a Tensor,
    pub response_mask: &'a Tensor,
    pub response_positions: &'a Tensor,
}

/// Where each row of a responses' forward finds its prompt's keys and values among those of the
/// prompts' forward.
pub(crate) enum PastGather {
    /// (B,) i64: row b's are those of prompt row `owner[b]` (the padded layout).
    Rows(Tensor),
    /// (B, W) i64: row b's are those at these flat positions (prompt row x width + column) of
    /// the prompts' rows (packed rows, [`crate::packed`]).
    Positions(Tensor),
}

impl PastGather {
    /// A (G, Hkv, P, d) tensor of the prompts' keys or values, gathered to (B, Hkv, W, d).
    pub(crate) fn gather(&self, t: &Tensor) -> Tensor {
        match self {
            PastGather::Rows(owner) => t.index_select(0, owner),
            PastGather::Positions(index) => {
                let [g, h, p, d] = t.size()[..] else {
                    unreachable!("keys and values are 4-D")
                };
                let (b, w) = index.size2().expect("a (B, W) index");
                t.transpose(1, 2)
                    .reshape([g * p, h, d])
                    .index_select(0, &index.reshape([b * w]))
                    .view([b, w, h, d])
                    .transpose(1, 2)
            }
        }
    }

    /// Every layer's keys and values gathered ([`PastGather::gather`]).
    pub(crate) fn gather_layers(&self, kv: &[(Tensor, Tensor)]) -> Vec<(Tensor, Tensor)> {
        kv.iter()
            .map(|(k, v)| (self.gather(k), self.gather(v)))
            .collect()
    }
}

impl SharedPrefixRows<'_> {
    /// Per-prompt values (first dimension: prompts) repeated for each row.
    pub(crate) fn to_rows(&self, t: &Tensor) -> Tensor {
        t.index_select(0, self.prompt_of_row)
    }

    /// What the responses' forward (all but their last token) attends to besides themselves:
    /// each layer's prompt keys and values `kv` repeated for each row, and the (B, P + R - 1)
    /// mask over prompt and response.
    pub(crate) fn response_context(
        &self,
        kv: &[(Tensor, Tensor)],
    ) -> (Vec<(Tensor, Tensor)>, Tensor) {
        let r = self.response_ids.size()[1];
        let past = PastGather::Rows(self.prompt_of_row.shallow_clone()).gather_layers(kv);
        let mask = Tensor::cat(
            &[
                self.to_rows(self.prompt_mask),
                self.response_mask.narrow(1, 0, r - 1),
            ],
            1,
        );
        (past, mask)
    }
}

impl CausalLm {
    /// (B, R, H) final hidden states that predict every response token (the last prompt position,
    /// then the response's own but its last), with autograd unless called under `tch::no_grad`:
    /// what [`CausalLm::forward_hidden`] gives at these positions on the rows' full sequences
    /// (prompt then response), with each distinct prompt computed once. Score them with
    /// [`CausalLm::score_tokens`] against `response_ids`.
    pub fn response_hidden_shared(&self, rows: &SharedPrefixRows<'_>) -> Tensor {
        let (prompt_hidden, kv) = self.forward_layers(
            rows.prompt_ids,
            rows.prompt_positions,
            Mask::Padding(rows.prompt_mask),
            PastKv::None,
            true,
        );
        let p = rows.prompt_ids.size()[1];
        let r = rows.response_ids.size()[1];
        // The last prompt position predicts the first response token.
        let last = rows.to_rows(&prompt_hidden.narrow(1, p - 1, 1));
        if r > 1 {
            let (past, mask) = rows.response_context(&kv);
            let (response_hidden, _) = self.forward_layers(
                &rows.response_ids.narrow(1, 0, r - 1),
                &rows.response_positions.narrow(1, 0, r - 1),
                Mask::Padding(&mask),
                PastKv::Given(&past),
                false,
            );
            Tensor::cat(&[last, response_hidden], 1)
        } else {
            // The responses' sweep, as every forward over shared prompts makes.
            self.sweep_layers_without_compute();
            last
        }
    }
}
