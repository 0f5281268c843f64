//! libtorch CPU kernels that tch does not bind, compiled from `csrc/kernels.cpp`.
//!
//! [`PackedLinear`]: `x @ W^T + b` through oneDNN with W reordered once into oneDNN's blocked
//! layout. On one core of this project's CPU, SmolLM2-135M's decode matmuls at 16 rows run about
//! 1.5x faster than `Tensor::linear` (MKL sgemm re-packs W on every call); see BENCHMARKS.md. The
//! summation order differs from `linear`, so results differ by float rounding (about 1e-6 relative
//! in f32). It is for inference only: no autograd, and the weight is a copy that must be rebuilt
//! after the master weight changes.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use anyhow::{bail, Result};
use tch::{Device, Tensor};

extern "C" {
    fn temper_kernels_free_error(err: *mut c_char);
    fn temper_kernels_have_packed_linear() -> c_int;
    fn temper_pack_linear_weight(
        w: *const c_void,
        out: *mut *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int;
    fn temper_packed_linear(
        x: *const c_void,
        w: *const c_void,
        bias: *const c_void,
        out: *mut *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int;
}

/// Turn a C status + out pointer into a Tensor or an error.
fn finish(status: c_int, out: *mut c_void, err: *mut c_char, what: &str) -> Result<Tensor> {
    if status != 0 {
        let msg = if err.is_null() {
            "no message".to_string()
        } else {
            // SAFETY: err is a NUL-terminated string malloc'ed by the C++ side.
            let s = unsafe { CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned();
            unsafe { temper_kernels_free_error(err) };
            s
        };
        bail!("{what}: {msg}");
    }
    // SAFETY: on success the C++ side stored a heap-allocated at::Tensor, which tch now owns.
    Ok(unsafe { Tensor::from_ptr(out as _) })
}

/// Whether this libtorch has oneDNN's linear ops (CPU builds with mkldnn; PyTorch's x86 wheels do).
pub fn packed_linear_available() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    // SAFETY: a pure query of the op registry.
    *HAVE.get_or_init(|| unsafe { temper_kernels_have_packed_linear() } != 0)
}

/// An inference-only linear layer whose weight lives in oneDNN's blocked layout.
#[derive(Debug)]
pub struct PackedLinear {
    /// Opaque: only valid as the weight argument of `temper_packed_linear`.
    packed: Tensor,
    bias: Option<Tensor>,
    in_features: i64,
    out_features: i64,
}

impl PackedLinear {
    /// Pack `weight` (N, K) and keep `bias` (N); both are detached copies in their own dtype,
    /// which inputs must match. CPU only.
    pub fn new(weight: &Tensor, bias: Option<&Tensor>) -> Result<Self> {
        if !packed_linear_available() {
            bail!("this libtorch has no oneDNN linear (mkldnn::_linear_pointwise)");
        }
        if weight.device() != Device::Cpu {
            bail!("PackedLinear is CPU-only (weight on {:?})", weight.device());
        }
        let (out_features, in_features) = weight.size2()?;
        let w = weight.detach().contiguous();
        let mut out = std::ptr::null_mut();
        let mut err = std::ptr::null_mut();
        // SAFETY: `w` outlives the call; out/err are written by the callee.
        let status = unsafe { temper_pack_linear_weight(w.as_ptr() as _, &mut out, &mut err) };
        let packed = finish(status, out, err, "packing a linear weight")?;
        Ok(Self {
            packed,
            bias: bias.map(|b| b.detach().contiguous()),
            in_features,
            out_features,
        })
    }

    pub fn in_features(&self) -> i64 {
        self.in_features
    }

    pub fn out_features(&self) -> i64 {
        self.out_features
    }

    /// `x (..., K) @ W^T + b` -> `(..., N)`, in x's dtype (which must be the weight's).
    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.try_forward(x).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn try_forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut shape = x.size();
        let k = *shape.last().unwrap_or(&0);
        if k != self.in_features {
            bail!(
                "PackedLinear: input has {k} features, the weight expects {}",
                self.in_features
            );
        }
        let x2 = x.reshape([-1, k]).contiguous();
        let mut out = std::ptr::null_mut();
        let mut err = std::ptr::null_mut();
        let bias = self
            .bias
            .as_ref()
            .map_or(std::ptr::null(), |b| b.as_ptr() as *const c_void);
        // SAFETY: every tensor outlives the call; out/err are written by the callee.
        let status = unsafe {
            temper_packed_linear(
                x2.as_ptr() as _,
                self.packed.as_ptr() as _,
                bias,
                &mut out,
                &mut err,
            )
        };
        let y = finish(status, out, err, "oneDNN linear")?;
        *shape.last_mut().expect("x has at least one dim") = self.out_features;
        Ok(y.view(shape.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    #[test]
    fn matches_linear_f32_and_bf16() {
        tch::manual_seed(0);
        for kind in [Kind::Float, Kind::BFloat16] {
            let w = Tensor::randn([300, 96], (Kind::Float, Device::Cpu)).to_kind(kind);
            let b = Tensor::randn([300], (Kind::Float, Device::Cpu)).to_kind(kind);
            let x = Tensor::randn([2, 5, 96], (Kind::Float, Device::Cpu)).to_kind(kind);
            let p = PackedLinear::new(&w, Some(&b)).unwrap();
            let got = p.forward(&x).to_kind(Kind::Float);
            let want = x.linear(&w, Some(&b)).to_kind(Kind::Float);
            assert_eq!(got.size(), [2, 5, 300]);
            let tol = if kind == Kind::Float { 1e-4 } else { 0.1 };
            let diff = (&got - &want).abs().max().double_value(&[]);
            assert!(diff < tol, "{kind:?}: max diff {diff}");
            // Without bias.
            let p = PackedLinear::new(&w, None).unwrap();
            let diff = (p.forward(&x).to_kind(Kind::Float)
                - x.linear(&w, None::<&Tensor>).to_kind(Kind::Float))
            .abs()
            .max()
            .double_value(&[]);
            assert!(diff < tol, "{kind:?} no bias: max diff {diff}");
        }
    }

    #[test]
    fn rows_do_not_depend_on_the_batch() {
        // The property the sampler relies on to give a row the same numbers whatever else is
        // being decoded: row i of a 1-row call equals row i of a 40-row call, bitwise.
        tch::manual_seed(1);
        let w = Tensor::randn([512, 256], (Kind::Float, Device::Cpu));
        let x = Tensor::randn([40, 256], (Kind::Float, Device::Cpu));
        let p = PackedLinear::new(&w, None).unwrap();
        let all = p.forward(&x);
        for i in [0, 7, 39] {
            let one = p.forward(&x.narrow(0, i, 1));
            assert!(one.equal(&all.narrow(0, i, 1)), "row {i}");
        }
    }

    #[test]
    fn wrong_width_is_an_error() {
        let w = Tensor::zeros([4, 3], (Kind::Float, Device::Cpu));
        let p = PackedLinear::new(&w, None).unwrap();
        let e = p
            .try_forward(&Tensor::zeros([2, 5], (Kind::Float, Device::Cpu)))
            .unwrap_err();
        assert!(e.to_string().contains("5 features"), "{e}");
    }
}
