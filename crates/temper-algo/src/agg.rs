//! Loss aggregation (`actor.loss_agg_mode`), normalised by mini-batch-global counts.
//!
//! The trainer builds one [`AggContext`] per mini-batch (optimizer step) from the masks of the
//! whole mini-batch, and aggregates each micro-batch with it: the micro-batch losses then SUM to
//! the loss of the whole mini-batch, so gradient accumulation gives the same gradient however the
//! mini-batch is split. [`agg_loss`] is the plain verl-style call on one batch (local counts).
//!
//! With `L` the per-token loss, `M` the mask, `R+` the number of sequences of the mini-batch with at
//! least one valid token (rows without one are padding: excluded, as in verl 0.9's `agg_loss`),
//! `S` the `loss_scale_factor`:
//! - `token-mean`: `sum M L / sum M`
//! - `seq-mean-token-sum`: `sum_i(sum_t M L) / R+`
//! - `seq-mean-token-mean`: `sum_i(sum_t M L / |y_i|) / R+`
//! - `seq-mean-token-sum-norm`: `sum_i(sum_t M L) / R+ / S`, `S` = `loss_scale_factor`, else the
//!   padded response length (a sequence mean, then `/ S`, as in verl 0.9)
//! - `token-sum`: `sum M L`

use anyhow::{bail, Result};
use tch::{Kind, Tensor};

use crate::masked::{mask_like, masked, masked_sum};
use crate::names::named_enum;

named_enum! {
    /// `actor.loss_agg_mode`.
    #[derive(Default)]
    pub enum AggMode ("loss_agg_mode") {
        #[default]
        TokenMean => "token-mean" | "token_mean",
        SeqMeanTokenSum => "seq-mean-token-sum" | "seq_mean_token_sum",
        SeqMeanTokenMean => "seq-mean-token-mean" | "seq_mean_token_mean",
        SeqMeanTokenSumNorm => "seq-mean-token-sum-norm" | "seq_mean_token_sum_norm",
        TokenSum => "token-sum" | "token_sum",
    }
}

/// Mini-batch-global normalisers for one optimizer step. Compute once per mini-batch; pass to the
/// aggregation of every micro-batch of that mini-batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AggContext {
    pub mode: AggMode,
    /// `sum M` over the mini-batch.
    pub global_tokens: f64,
    /// Rows with at least one valid token (`R+`), the divisor of the `seq-mean-*` modes.
    pub global_seqs: f64,
    /// All rows, the divisor of `geo_mean` (verl's `torch.mean` over the batch).
    pub global_rows: f64,
    /// `S` of `seq-mean-token-sum-norm`, resolved (config value or padded length).
    pub loss_scale_factor: f64,
}

impl AggContext {
    /// The context of a mini-batch given as one mask `(B, T)`.
    pub fn from_mask(mode: AggMode, mask: &Tensor, loss_scale_factor: Option<f64>) -> Result<Self> {
        Self::from_masks(mode, &[mask], loss_scale_factor)
    }

    /// The context of a mini-batch given as the masks of its micro-batches. Without a
    /// `loss_scale_factor`, `S` is the longest padded length among them.
    pub fn from_masks(
        mode: AggMode,
        masks: &[&Tensor],
        loss_scale_factor: Option<f64>,
    ) -> Result<Self> {
        let (mut tokens, mut seqs, mut rows, mut max_t) = (0.0, 0.0, 0.0, 0i64);
        for (k, m) in masks.iter().enumerate() {
            if m.dim() != 2 {
                bail!(
                    "response_mask of micro-batch {k}: expected 2 dims (B, T), got shape {:?}",
                    m.size()
                );
            }
            let m = m.to_kind(Kind::Double);
            let per_row = m.sum_dim_intlist(-1, false, None::<Kind>);
            tokens += per_row.sum(None::<Kind>).double_value(&[]);
            seqs += per_row
                .gt(0.0)
                .to_kind(Kind::Double)
                .sum(None::<Kind>)
                .double_value(&[]);
            rows += m.size()[0] as f64;
            max_t = max_t.max(m.size()[1]);
        }
        let s = match loss_scale_factor {
            Some(s) if s.is_nan() || s <= 0.0 => bail!("loss_scale_factor must be > 0, got {s}"),
            Some(s) => s,
            None => max_t as f64,
        };
        Ok(AggContext {
            mode,
            global_tokens: tokens,
            global_seqs: seqs,
            global_rows: rows,
            loss_scale_factor: s,
        })
    }

    /// The same counts with another mode (losses that force their own aggregation).
    pub fn with_mode(&self, mode: AggMode) -> Self {
        AggContext { mode, ..*self }
    }

    /// Aggregate a micro-batch's `loss_mat` `(B, T)` under `mask` `(B, T)` into a scalar.
    pub fn aggregate(&self, loss_mat: &Tensor, mask: &Tensor) -> Tensor {
        match self.mode {
            AggMode::TokenMean => masked_sum(loss_mat, mask, None) / self.global_tokens,
            AggMode::TokenSum => masked_sum(loss_mat, mask, None),
            AggMode::SeqMeanTokenSum => masked_sum(loss_mat, mask, None) / self.global_seqs,
            AggMode::SeqMeanTokenSumNorm => {
                masked_sum(loss_mat, mask, None) / self.global_seqs / self.loss_scale_factor
            }
            AggMode::SeqMeanTokenMean => {
                let x = masked(loss_mat, mask);
                let count =
                    mask_like(mask, &x)
                        .expand_as(&x)
                        .sum_dim_intlist(-1, false, None::<Kind>);
                let row_sum = x.sum_dim_intlist(-1, false, None::<Kind>);
                // Rows without a valid token have row_sum == 0; divide them by 1 instead of 0.
                let safe = count.ones_like().where_self(&count.eq(0.0), &count);
                (row_sum / safe).sum(None::<Kind>) / self.global_seqs
            }
        }
    }
}

/// verl's `agg_loss(loss_mat, loss_mask, loss_agg_mode, loss_scale_factor)` on one batch: the
/// counts are those of this batch.
pub fn agg_loss(
    loss_mat: &Tensor,
    mask: &Tensor,
    mode: AggMode,
    loss_scale_factor: Option<f64>,
) -> Result<Tensor> {
    check_same_shape("loss_mat", loss_mat, "response_mask", mask)?;
    Ok(AggContext::from_mask(mode, mask, loss_scale_factor)?.aggregate(loss_mat, mask))
}

/// Error unless `a` and `b` have the same shape.
pub(crate) fn check_same_shape(an: &str, a: &Tensor, bn: &str, b: &Tensor) -> Result<()> {
    if a.size() != b.size() {
        bail!(
            "{an} has shape {:?} but {bn} has shape {:?}",
            a.size(),
            b.size()
        );
    }
    Ok(())
}
