//! The optimizer's multi-tensor ops (`csrc/optim.cpp`): PyTorch's fused AdamW kernel and the
//! foreach gradient-norm clip, over every parameter in one call each.

use std::ffi::{c_char, c_int, c_void};

use anyhow::{bail, Result};
use tch::Tensor;

use crate::{finish, take_error};

extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn temper_fused_adamw(
        params: *const *mut c_void,
        grads: *const *mut c_void,
        exp_avgs: *const *mut c_void,
        exp_avg_sqs: *const *mut c_void,
        steps: *const *mut c_void,
        n: i64,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        err: *mut *mut c_char,
    ) -> c_int;
    fn temper_clip_grad_norm(
        grads: *const *mut c_void,
        n: i64,
        max_norm: f64,
        total: *mut *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int;
}

/// The tensors of one fused AdamW step, index for index.
pub struct FusedAdamwGroup<'a> {
    pub params: Vec<&'a Tensor>,
    pub grads: Vec<&'a Tensor>,
    pub exp_avgs: Vec<&'a Tensor>,
    pub exp_avg_sqs: Vec<&'a Tensor>,
    /// One f32 0-dim step count per parameter, on its device (incremented by the call).
    pub steps: Vec<&'a Tensor>,
}

fn ptrs(ts: &[&Tensor]) -> Vec<*mut c_void> {
    ts.iter().map(|t| t.as_ptr() as *mut c_void).collect()
}

/// `torch.optim.AdamW(fused=True).step()` (amsgrad and maximize off) on tensors of one device
/// and dtype: the step counts incremented, then `torch._fused_adamw_`; bitwise PyTorch's.
pub fn fused_adamw(
    group: &FusedAdamwGroup,
    lr: f64,
    betas: (f64, f64),
    weight_decay: f64,
    eps: f64,
) -> Result<()> {
    let n = group.params.len();
    for (what, len) in [
        ("gradients", group.grads.len()),
        ("exp_avgs", group.exp_avgs.len()),
        ("exp_avg_sqs", group.exp_avg_sqs.len()),
        ("steps", group.steps.len()),
    ] {
        if len != n {
            bail!("fused AdamW: {n} parameters but {len} {what}");
        }
    }
    if n == 0 {
        return Ok(());
    }
    let (p, g, m, v, s) = (
        ptrs(&group.params),
        ptrs(&group.grads),
        ptrs(&group.exp_avgs),
        ptrs(&group.exp_avg_sqs),
        ptrs(&group.steps),
    );
    let mut err = std::ptr::null_mut();
    // SAFETY: every pointer is a live tensor borrowed for the call; the lists are `n` long.
    let status = unsafe {
        temper_fused_adamw(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            s.as_ptr(),
            n as i64,
            lr,
            betas.0,
            betas.1,
            weight_decay,
            eps,
            &mut err,
        )
    };
    if status != 0 {
        bail!("fused AdamW: {}", take_error(err));
    }
    Ok(())
}

/// `torch.nn.utils.clip_grad_norm_(.., max_norm)` over `grads` (one device), foreach path: returns
/// the pre-clip total L2 norm as a 0-dim tensor on the gradients' device (not read to the host);
/// the gradients are scaled by `min(max_norm / (norm + 1e-6), 1)` when `max_norm > 0`.
pub fn clip_grad_norm(grads: &[&Tensor], max_norm: f64) -> Result<Tensor> {
    let g = ptrs(grads);
    let mut out = std::ptr::null_mut();
    let mut err = std::ptr::null_mut();
    // SAFETY: every pointer is a live tensor borrowed for the call; out/err are written by it.
    let status =
        unsafe { temper_clip_grad_norm(g.as_ptr(), g.len() as i64, max_norm, &mut out, &mut err) };
    finish(status, out, err, "clip_grad_norm")
}
