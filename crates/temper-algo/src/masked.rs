//! Masked reductions with verl's conventions.
//!
//! Positions where the mask is 0 are replaced by 0 before multiplying, so NaN/inf in padding cannot
//! leak into a sum (verl's `masked_sum`). `masked_mean` has no epsilon: a mean over an all-masked
//! slice is 0/0 = NaN, as in verl's `masked_mean` and CS336's `masked_mean`.

use anyhow::{bail, Result};
use tch::{Kind, Tensor};

/// The mask as a tensor of `like`'s dtype and device.
pub(crate) fn mask_like(mask: &Tensor, like: &Tensor) -> Tensor {
    mask.to_kind(like.kind()).to_device(like.device())
}

/// `values` with masked-out positions set to exactly 0, times the mask.
pub(crate) fn masked(values: &Tensor, mask: &Tensor) -> Tensor {
    let m = mask_like(mask, values);
    values.zeros_like().where_self(&m.eq(0.0), values) * &m
}

/// `sum(values * mask)` over `dim` (all elements when `None`).
pub fn masked_sum(values: &Tensor, mask: &Tensor, dim: Option<i64>) -> Tensor {
    let x = masked(values, mask);
    match dim {
        None => x.sum(None::<Kind>),
        Some(d) => x.sum_dim_intlist(d, false, None::<Kind>),
    }
}

/// `sum(values * mask) / sum(mask)` over `dim` (all elements when `None`); NaN where the mask is empty.
pub fn masked_mean(values: &Tensor, mask: &Tensor, dim: Option<i64>) -> Tensor {
    let x = masked(values, mask);
    let m = mask_like(mask, &x).expand_as(&x);
    match dim {
        None => x.sum(None::<Kind>) / m.sum(None::<Kind>),
        Some(d) => {
            x.sum_dim_intlist(d, false, None::<Kind>) / m.sum_dim_intlist(d, false, None::<Kind>)
        }
    }
}

/// verl's metric mean: `sum(values * mask) / (sum(mask) + 1e-8)` over all elements (0 when the
/// mask is empty). Used for `pg_clipfrac`, `ppo_kl` and the other masked-mean metrics.
pub fn masked_mean_eps(values: &Tensor, mask: &Tensor, dim: Option<i64>) -> Tensor {
    let x = masked(values, mask);
    let m = mask_like(mask, &x).expand_as(&x);
    match dim {
        None => x.sum(None::<Kind>) / (m.sum(None::<Kind>) + 1e-8),
        Some(d) => {
            x.sum_dim_intlist(d, false, None::<Kind>)
                / (m.sum_dim_intlist(d, false, None::<Kind>) + 1e-8)
        }
    }
}

/// verl's `masked_var`: masked variance over all elements, Bessel-corrected when `unbiased`.
pub fn masked_var(values: &Tensor, mask: &Tensor, unbiased: bool) -> Result<Tensor> {
    let mean = masked_mean(values, mask, None);
    let centered = values - &mean;
    let var = masked_mean(&centered.square(), mask, None);
    if !unbiased {
        return Ok(var);
    }
    let n = valid_count(values, mask);
    if n == 0.0 {
        bail!("masked variance: the mask has no valid element");
    }
    if n == 1.0 {
        bail!(
            "masked variance: the mask has a single valid element (unbiased variance divides by 0)"
        );
    }
    Ok(var * (n / (n - 1.0)))
}

/// verl's `masked_whiten`: `(x - mean) / sqrt(var_unbiased + 1e-8)` with masked statistics.
/// Positions outside the mask are whitened too (callers multiply by the mask).
pub fn masked_whiten(values: &Tensor, mask: &Tensor, shift_mean: bool) -> Result<Tensor> {
    let mean = masked_mean(values, mask, None);
    let var = masked_var(values, mask, true)?;
    let mut w = (values - &mean) * (var + 1e-8).rsqrt();
    if !shift_mean {
        w += mean;
    }
    Ok(w)
}

/// Number of valid elements (mask broadcast to `values`' shape), as f64.
pub(crate) fn valid_count(values: &Tensor, mask: &Tensor) -> f64 {
    let x = masked(values, mask);
    mask_like(mask, &x)
        .expand_as(&x)
        .sum(Kind::Double)
        .double_value(&[])
}
