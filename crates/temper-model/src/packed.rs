//! Packed rows (verl's `use_remove_padding`, TRL's padding-free training): the sequences of a
//! micro-batch side by side in as few rows as hold them, each with its own positions and a
//! block-diagonal causal mask ([`crate::attention::packed_attention_mask`]), so that the
//! decoder's matmuls run on real tokens instead of every row padded to the longest prompt plus
//! the longest response. Rows are as wide as the longest sequence and filled first-fit
//! decreasing, so no row's attention is wider than the padded layout's.
//!
//! With shared prompts (the n responses of a GRPO group, [`crate::shared_prefix`]) the distinct
//! prompts are packed and run once, then the responses are packed and attend, besides their own
//! earlier tokens, to their prompt's keys and values, gathered from the prompts' rows.
//!
//! The numbers equal the padded layout's to float rounding (a softmax over fewer masked keys
//! adds in another order); tests/packed.rs holds the two together, gradients included.

use std::collections::HashMap;

use anyhow::{bail, Result};
use tch::{Device, Tensor};

use crate::attention::packed_attention_mask;
use crate::model::{CausalLm, LayerCheckpoints, Mask, PastKv, Segment};
use crate::shared_prefix::PastGather;

/// One sequence to pack: its tokens, the position of its first token, and its group (the prompt
/// it attends to, with shared prompts; 1-based).
struct Seq {
    tokens: Vec<i64>,
    first_position: i64,
    group: i64,
}

/// Sequences packed first-fit decreasing into rows of `width` tokens, as flat (rows x width)
/// values. A row holds sequences of one group only: a response row attends to one prompt (rows
/// mixing the groups of a shuffled micro-batch would attend to several, at several times the
/// cost).
struct Bins {
    rows: usize,
    width: usize,
    ids: Vec<i64>,
    positions: Vec<i64>,
    /// Each token's sequence within its row (1, 2, ...); 0 on padding.
    segments: Vec<i64>,
    /// Each token's sequence's group; 0 on padding.
    groups: Vec<i64>,
    /// Per sequence: the flat index (row x width + column) of its first token (0 when empty).
    starts: Vec<usize>,
    /// Per row: the group of its sequences (0 for an empty row).
    row_groups: Vec<i64>,
}

impl Bins {
    fn pack(seqs: &[Seq]) -> Bins {
        let width = seqs
            .iter()
            .map(|s| s.tokens.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let mut order: Vec<usize> = (0..seqs.len())
            .filter(|&i| !seqs[i].tokens.is_empty())
            .collect();
        // Longest first (stable: equal lengths keep their order).
        order.sort_by_key(|&i| std::cmp::Reverse(seqs[i].tokens.len()));
        // Per row: the tokens it holds so far, and its group.
        let mut fill: Vec<(usize, i64)> = vec![];
        let mut starts = vec![0; seqs.len()];
        for &i in &order {
            let (len, group) = (seqs[i].tokens.len(), seqs[i].group);
            let fits = |&(f, g): &(usize, i64)| g == group && f + len <= width;
            let row = match fill.iter().position(fits) {
                Some(r) => r,
                None => {
                    fill.push((0, group));
                    fill.len() - 1
                }
            };
            starts[i] = row * width + fill[row].0;
            fill[row].0 += len;
        }
        let rows = fill.len().max(1);
        let mut b = Bins {
            rows,
            width,
            ids: vec![0; rows * width],
            positions: vec![0; rows * width],
            segments: vec![0; rows * width],
            groups: vec![0; rows * width],
            starts,
            row_groups: vec![0; rows],
        };
        let mut next_segment = vec![0i64; rows];
        for &i in &order {
            let row = b.starts[i] / width;
            next_segment[row] += 1;
            let s = &seqs[i];
            for (k, &tok) in s.tokens.iter().enumerate() {
                let at = b.starts[i] + k;
                b.ids[at] = tok;
                b.positions[at] = s.first_position + k as i64;
                b.segments[at] = next_segment[row];
                b.groups[at] = s.group;
            }
            b.row_groups[row] = s.group;
        }
        b
    }

    fn tensor(&self, values: &[i64], device: Device) -> Tensor {
        Tensor::from_slice(values)
            .view([self.rows as i64, self.width as i64])
            .to(device)
    }
}

/// One forward's final hidden states (after the final norm), its layers' keys and values (when
/// collected) and, with checkpointing, what the backward runs again.
struct Run {
    hidden: Tensor,
    kv: Vec<(Tensor, Tensor)>,
    segment: Option<Segment>,
}

impl CausalLm {
    /// (N, R, H) final hidden states that predict each row's response tokens (row i's token j at
    /// `[i, j]`; past a row's response, finite values nothing should read), computed on packed
    /// rows: what [`CausalLm::forward_hidden`] gives at those positions on the padded rows, to
    /// float rounding. `rows` are (prompt, response) pairs; every prompt has a token, every
    /// response at most `width`. With `share_prompts`, each distinct prompt runs once. With
    /// `checkpoint`, the layers keep only their inputs ([`LayerCheckpoints`]; pass them to
    /// [`crate::TokenScores::with_checkpoints`]). Autograd as for `forward_hidden`.
    pub fn response_hidden_packed(
        &self,
        rows: &[(&[i64], &[i64])],
        width: i64,
        share_prompts: bool,
        checkpoint: bool,
    ) -> Result<(Tensor, Option<LayerCheckpoints<'_>>)> {
        for (i, (prompt, response)) in rows.iter().enumerate() {
            if prompt.is_empty() {
                bail!("packed rows: row {i} has an empty prompt (nothing predicts its first response token)");
            }
            if response.len() as i64 > width {
                bail!(
                    "packed rows: row {i}'s response has {} tokens, more than the width {width}",
                    response.len()
                );
            }
        }
        if share_prompts {
            Ok(self.packed_shared(rows, width, checkpoint))
        } else {
            Ok(self.packed_whole(rows, width, checkpoint))
        }
    }

    /// Each row's prompt and response (but its last token) as one sequence.
    fn packed_whole(
        &self,
        rows: &[(&[i64], &[i64])],
        width: i64,
        checkpoint: bool,
    ) -> (Tensor, Option<LayerCheckpoints<'_>>) {
        let seqs: Vec<Seq> = rows
            .iter()
            .map(|(p, r)| Seq {
                tokens: [*p, &r[..r.len().saturating_sub(1)]].concat(),
                first_position: 0,
                group: 1,
            })
            .collect();
        let bins = Bins::pack(&seqs);
        let device = self.device();
        let mask = packed_attention_mask(&bins.tensor(&bins.segments, device), None);
        let run = self.packed_run(&bins, &mask, None, false, checkpoint);
        let index: Vec<i64> = rows
            .iter()
            .enumerate()
            .flat_map(|(i, (p, r))| {
                let first = bins.starts[i] + p.len() - 1;
                (0..width as usize).map(move |j| if j < r.len() { (first + j) as i64 } else { 0 })
            })
            .collect();
        let hidden = gather_positions(&[&run.hidden], &index, rows.len(), width);
        let checkpoints = run.segment.map(|s| LayerCheckpoints::new(self, s, None));
        (hidden, checkpoints)
    }

    /// Distinct prompts packed and run once; responses (but their last token) packed, attending
    /// to their prompt's keys and values.
    fn packed_shared(
        &self,
        rows: &[(&[i64], &[i64])],
        width: i64,
        checkpoint: bool,
    ) -> (Tensor, Option<LayerCheckpoints<'_>>) {
        let device = self.device();
        let mut distinct: HashMap<&[i64], usize> = HashMap::new();
        let mut prompts: Vec<&[i64]> = vec![];
        let owner: Vec<usize> = rows
            .iter()
            .map(|(p, _)| {
                *distinct.entry(p).or_insert_with(|| {
                    prompts.push(p);
                    prompts.len() - 1
                })
            })
            .collect();
        let prompt_seqs: Vec<Seq> = prompts
            .iter()
            .enumerate()
            .map(|(k, p)| Seq {
                tokens: p.to_vec(),
                first_position: 0,
                group: k as i64 + 1,
            })
            .collect();
        let pb = Bins::pack(&prompt_seqs);
        let prompt_mask = packed_attention_mask(&pb.tensor(&pb.segments, device), None);
        let prompt_run = self.packed_run(&pb, &prompt_mask, None, true, checkpoint);
        let response_seqs: Vec<Seq> = rows
            .iter()
            .zip(&owner)
            .map(|((p, r), &k)| Seq {
                tokens: r[..r.len().saturating_sub(1)].to_vec(),
                first_position: p.len() as i64,
                group: k as i64 + 1,
            })
            .collect();
        // The hidden state before response token 0 is the prompt's last; before token j, the
        // response's token j - 1 (flat positions after the prompts' rows).
        let after_prompts = pb.rows * pb.width;
        let last_of_prompt = |k: usize| (pb.starts[k] + prompts[k].len() - 1) as i64;
        if response_seqs.iter().all(|s| s.tokens.is_empty()) {
            let index: Vec<i64> = rows
                .iter()
                .zip(&owner)
                .flat_map(|((_, r), &k)| {
                    (0..width as usize)
                        .map(move |j| if j < r.len() { last_of_prompt(k) } else { 0 })
                })
                .collect();
            let hidden = gather_positions(&[&prompt_run.hidden], &index, rows.len(), width);
            // The responses' sweep other ranks may make.
            self.sweep_layers_without_compute();
            let checkpoints = prompt_run
                .segment
                .map(|s| LayerCheckpoints::new(self, s, None));
            return (hidden, checkpoints);
        }
        let rb = Bins::pack(&response_seqs);
        // Each response row's past: the prompt of its sequences.
        let past_width = rb
            .row_groups
            .iter()
            .map(|&g| prompts[g as usize - 1].len())
            .max()
            .unwrap_or(0)
            .max(1);
        let (mut past_index, mut past_groups) = (
            vec![0i64; rb.rows * past_width],
            vec![0i64; rb.rows * past_width],
        );
        for (row, &g) in rb.row_groups.iter().enumerate() {
            let k = g as usize - 1;
            for c in 0..prompts[k].len() {
                past_index[row * past_width + c] = (pb.starts[k] + c) as i64;
                past_groups[row * past_width + c] = g;
            }
        }
        let shape = [rb.rows as i64, past_width as i64];
        let gather = PastGather::Positions(Tensor::from_slice(&past_index).view(shape).to(device));
        let past_groups = Tensor::from_slice(&past_groups).view(shape).to(device);
        let mask = packed_attention_mask(
            &rb.tensor(&rb.segments, device),
            Some((&past_groups, &rb.tensor(&rb.groups, device))),
        );
        let past = gather.gather_layers(&prompt_run.kv);
        let response_run = self.packed_run(&rb, &mask, Some(&past), false, checkpoint);
        let index: Vec<i64> = rows
            .iter()
            .enumerate()
            .zip(&owner)
            .flat_map(|((i, (_, r)), &k)| {
                let start = after_prompts + rb.starts[i];
                (0..width as usize).map(move |j| match j {
                    0 if !r.is_empty() => last_of_prompt(k),
                    j if j < r.len() => (start + j - 1) as i64,
                    _ => 0,
                })
            })
            .collect();
        let hidden = gather_positions(
            &[&prompt_run.hidden, &response_run.hidden],
            &index,
            rows.len(),
            width,
        );
        let checkpoints = match (prompt_run.segment, response_run.segment) {
            (Some(p), Some(r)) => Some(LayerCheckpoints::new(self, p, Some((r, gather)))),
            _ => None,
        };
        (hidden, checkpoints)
    }

    /// The layers over packed rows `bins` under `mask`, attending to `past` when given.
    fn packed_run(
        &self,
        bins: &Bins,
        mask: &Tensor,
        past: Option<&[(Tensor, Tensor)]>,
        collect: bool,
        checkpoint: bool,
    ) -> Run {
        let device = self.device();
        let ids = bins.tensor(&bins.ids, device);
        let positions = bins.tensor(&bins.positions, device);
        if checkpoint {
            let (segment, kv) =
                self.checkpointed(&ids, &positions, Mask::Full(mask), past, collect);
            Run {
                hidden: self.final_norm(&segment.last),
                kv,
                segment: Some(segment),
            }
        } else {
            let given = past.map_or(PastKv::None, PastKv::Given);
            let (hidden, kv) =
                self.forward_layers(&ids, &positions, Mask::Full(mask), given, collect);
            Run {
                hidden,
                kv,
                segment: None,
            }
        }
    }
}

/// The hidden states at flat positions `index` (rows x columns of `parts`, one after another)
/// as (n, width, H).
fn gather_positions(parts: &[&Tensor], index: &[i64], n: usize, width: i64) -> Tensor {
    let h = *parts[0]
        .size()
        .last()
        .expect("hidden states have a last dimension");
    let flat: Vec<Tensor> = parts.iter().map(|t| t.reshape([-1, h])).collect();
    let flat = if flat.len() == 1 {
        flat.into_iter().next().expect("one part")
    } else {
        Tensor::cat(&flat, 0)
    };
    let index = Tensor::from_slice(index).to(flat.device());
    flat.index_select(0, &index).view([n as i64, width, h])
}
