//! libtorch CPU kernels that tch does not bind, compiled from `csrc/kernels.cpp`.
//!
//! [`PackedLinear`]: `x @ W^T + b` through oneDNN with W reordered once into oneDNN's blocked
//! layout. On one core of this project's CPU, SmolLM2-135M's decode matmuls at 16 rows run about
//! 1.5x faster than `Tensor::linear` (MKL sgemm re-packs W on every call); see BENCHMARKS.md. The
//! summation order differs from `linear`, so results differ by float rounding (about 1e-6 relative
//! in f32). It is for inference only: no autograd, and the weight is a copy that must be rebuilt
//! after the master weight changes.

pub mod comm;
pub mod cpu;
pub mod graph;
pub mod memory;
pub mod optim;
pub mod profiler;
mod swiglu;

pub use comm::{
    collective_timeout, collective_timeout_from_env, comm_available, nccl_available, Backend, Comm,
    Rendezvous,
};

/// Whether this temper links a CUDA libtorch (a CPU build links libtorch_cpu only, so it sees no
/// CUDA device even on a machine with GPUs).
pub fn cuda_build() -> bool {
    env!("TEMPER_LIBTORCH_CUDA") == "1"
}
pub use cpu::{sampling_linear_kernel, CpuFeatures, LinearKernel};
pub use swiglu::{swiglu_down, SwigluLora};

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use tch::{Device, Kind, Tensor};

extern "C" {
    fn temper_kernels_free_error(err: *mut c_char);
    fn temper_clear_grad(t: *mut c_void, err: *mut *mut c_char) -> c_int;
    fn temper_zero_grad_if_missing(t: *mut c_void, err: *mut *mut c_char) -> c_int;
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
    fn temper_pack_fp16_weight(
        w: *const c_void,
        out: *mut *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int;
    fn temper_fp16_linear(
        x: *const c_void,
        w: *const c_void,
        bias: *const c_void,
        out: *mut *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int;
    fn temper_decode_attention_supports(head_dim: i64) -> c_int;
    fn temper_decode_attention(
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        bias: *const c_void,
        scale: f64,
        out: *mut *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int;
}

/// Turn a C status + out pointer into a Tensor or an error.
fn finish(status: c_int, out: *mut c_void, err: *mut c_char, what: &str) -> Result<Tensor> {
    if status != 0 {
        bail!("{what}: {}", take_error(err));
    }
    // SAFETY: on success the C++ side stored a heap-allocated at::Tensor, which tch now owns.
    Ok(unsafe { Tensor::from_ptr(out as _) })
}

/// Drops every parameter's gradient (PyTorch's `optimizer.zero_grad(set_to_none=True)`, its
/// default): between optimizer steps no gradient memory is held (the rollouts and the log-prob
/// passes run without it), and the next backward writes fresh gradients, equal to what it would
/// have added to zeros.
pub fn clear_grads(params: &[(String, Tensor)]) -> Result<()> {
    for (name, p) in params {
        let mut err = std::ptr::null_mut();
        // SAFETY: `p` is a live tensor for the call; err is written by the callee on failure.
        let status = unsafe { temper_clear_grad(p.as_ptr() as _, &mut err) };
        if status != 0 {
            bail!("clearing the gradient of {name}: {}", take_error(err));
        }
    }
    Ok(())
}

/// Gives every parameter without a gradient a zero one, allocated now. Before a backward this
/// puts all gradients in memory together, ahead of the activations, where one at a time between
/// the backward's temporaries they leave holes the allocator keeps; the backward then adds into
/// them as it does from the second micro-batch on. Data-parallel ranks also need every gradient
/// defined, so that each sends the same layout.
pub fn zero_grads_if_missing(params: &[(String, Tensor)]) -> Result<()> {
    for (name, p) in params {
        zero_grad_if_missing(p).with_context(|| format!("allocating the gradient of {name}"))?;
    }
    Ok(())
}

/// Gives `t` a zero gradient of its shape and dtype if it has none (tch has no setter for
/// `.grad`).
pub fn zero_grad_if_missing(t: &Tensor) -> Result<()> {
    let mut err = std::ptr::null_mut();
    // SAFETY: `t` is a live tensor for the call; err is written by the callee on failure.
    let status = unsafe { temper_zero_grad_if_missing(t.as_ptr() as _, &mut err) };
    if status != 0 {
        bail!("{}", take_error(err));
    }
    Ok(())
}

/// The message of a failed C++ call (freed here): every binding's one reader of it.
pub(crate) fn take_error(err: *mut c_char) -> String {
    if err.is_null() {
        return "no message".to_string();
    }
    // SAFETY: err is a NUL-terminated string malloc'ed by the C++ side, read once and freed.
    let s = unsafe { CStr::from_ptr(err) }
        .to_string_lossy()
        .into_owned();
    unsafe { temper_kernels_free_error(err) };
    s
}

type PackFn = unsafe extern "C" fn(*const c_void, *mut *mut c_void, *mut *mut c_char) -> c_int;
type LinearFn = unsafe extern "C" fn(
    *const c_void,
    *const c_void,
    *const c_void,
    *mut *mut c_void,
    *mut *mut c_char,
) -> c_int;

/// Pack a contiguous weight with one of the C++ packers.
fn pack(w: &Tensor, packer: PackFn, what: &str) -> Result<Tensor> {
    let mut out = std::ptr::null_mut();
    let mut err = std::ptr::null_mut();
    // SAFETY: `w` outlives the call; out/err are written by the callee.
    let status = unsafe { packer(w.as_ptr() as _, &mut out, &mut err) };
    finish(status, out, err, what)
}

/// `x (..., K) @ packed^T + bias` -> `(..., N)` through one of the C++ linears, which take x as
/// (M, K) in the dtype `x_kind` (None: x's own).
fn packed_forward(
    x: &Tensor,
    x_kind: Option<Kind>,
    packed: &Tensor,
    bias: Option<&Tensor>,
    (in_features, out_features): (i64, i64),
    linear: LinearFn,
    what: &str,
) -> Result<Tensor> {
    let mut shape = x.size();
    let k = *shape.last().unwrap_or(&0);
    if k != in_features {
        bail!("{what}: input has {k} features, the weight expects {in_features}");
    }
    let x2 = x.reshape([-1, k]);
    let x2 = x_kind
        .map_or(x2.shallow_clone(), |kind| x2.to_kind(kind))
        .contiguous();
    let mut out = std::ptr::null_mut();
    let mut err = std::ptr::null_mut();
    let bias = bias.map_or(std::ptr::null(), |b| b.as_ptr() as *const c_void);
    // SAFETY: every tensor outlives the call; out/err are written by the callee.
    let status = unsafe {
        linear(
            x2.as_ptr() as _,
            packed.as_ptr() as _,
            bias,
            &mut out,
            &mut err,
        )
    };
    let y = finish(status, out, err, what)?;
    *shape.last_mut().expect("x has at least one dim") = out_features;
    Ok(y.view(shape.as_slice()))
}

/// Whether this libtorch has oneDNN's linear ops (CPU builds with mkldnn; PyTorch's x86 wheels do).
pub fn packed_linear_available() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    // SAFETY: a pure query of the op registry.
    *HAVE.get_or_init(|| unsafe { temper_kernels_have_packed_linear() } != 0)
}

/// Whether [`PackedLinear`] works for weights of this dtype on this CPU. oneDNN packs bf16 with
/// AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT, but computes natively only with a bf16 dot product
/// ([`CpuFeatures::bf16_matmul_native`]); on an AVX2-only CPU only f32 packs. Probed once per dtype
/// by packing a small weight.
pub fn packed_linear_supports(kind: Kind) -> bool {
    static F32: OnceLock<bool> = OnceLock::new();
    static BF16: OnceLock<bool> = OnceLock::new();
    let cell = match kind {
        Kind::Float => &F32,
        Kind::BFloat16 => &BF16,
        _ => return false,
    };
    *cell.get_or_init(|| {
        packed_linear_available()
            && PackedLinear::new(&Tensor::zeros([16, 16], (kind, Device::Cpu)), None).is_ok()
    })
}

/// Whether [`decode_attention`] beats libtorch's matmuls on this CPU, as measured: with AVX-512 it
/// did (SmolLM2 f32 decode at batch 16: 196 -> 224 tok/s); on an AVX2-only AMD EPYC it was 3x
/// slower than libtorch's attention (1.5 vs 0.5 ms per layer at 150 keys) and the batched matmuls
/// were faster still, so there the model uses those.
pub fn decode_attention_is_fast() -> bool {
    CpuFeatures::get().avx512
}

/// Whether [`decode_attention`] has a kernel for this head dim (16, 32, 64, 80, 96, 128, 256).
pub fn decode_attention_supports(head_dim: i64) -> bool {
    // SAFETY: a pure function of its argument.
    unsafe { temper_decode_attention_supports(head_dim) != 0 }
}

/// Attention of one new token per row over a KV cache on CPU, computed in f32, for grouped-query
/// heads: `softmax(q k^T * scale + bias) v` where query head `h` reads kv head `h / (Hq / Hkv)`.
///
/// - `q`: (B, Hq, d) f32; `k`, `v`: (B, Hkv, S, d), both f32 or both bf16 (widened to f32 as
///   they are read, exactly: the result is the f32 kernel's on the same values), views of a
///   larger buffer allowed as long as the head dim has unit stride and k and v share strides;
///   `bias`: (B, S) f32 additive mask (0 or -inf; every row needs at least one finite entry).
///   Returns (B, Hq, d) f32.
///
/// Each (row, kv head) streams its keys and values once for all its query heads; a decode step is
/// bound by reading the cache, which `Tensor::matmul` at these shapes (3 x 64 x S per batch) does at
/// half the speed. Summation order differs from libtorch's attention (float rounding).
pub fn decode_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: f64,
) -> Result<Tensor> {
    let q = q.contiguous();
    let bias = bias.contiguous();
    let mut out = std::ptr::null_mut();
    let mut err = std::ptr::null_mut();
    // SAFETY: every tensor outlives the call; the C++ side checks shapes, dtypes and strides.
    let status = unsafe {
        temper_decode_attention(
            q.as_ptr() as _,
            k.as_ptr() as _,
            v.as_ptr() as _,
            bias.as_ptr() as _,
            scale,
            &mut out,
            &mut err,
        )
    };
    finish(status, out, err, "decode attention")
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
        let packed = pack(&w, temper_pack_linear_weight, "packing a linear weight")?;
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
        packed_forward(
            x,
            None,
            &self.packed,
            self.bias.as_ref(),
            (self.in_features, self.out_features),
            temper_packed_linear,
            "oneDNN linear",
        )
    }
}

/// Largest finite fp16 value: weights beyond it cannot be stored in fp16.
const FP16_MAX: f64 = 65504.0;

/// An inference-only linear layer with fp16 weights and f32 activations (FBGEMM's packed fp16
/// GEMM, which PyTorch's x86 wheels ship). For bf16 weights on CPUs where oneDNN has no bf16 path
/// (AVX2 only): every bf16 value in fp16's normal range [6.1e-5, 65504] is an fp16 value too
/// (8 significant bits fit in 11), so the weights are the same numbers; smaller ones land on
/// fp16's subnormal grid (absolute error < 3e-8). Products are summed in f32, as oneDNN's bf16
/// GEMM does. On one core of an AVX2 EPYC, SmolLM2's layer matmuls at 16 rows took 58 ms per
/// decode step this way, 107 ms with oneDNN in f32 and 378 ms as bf16 `linear` (MKL).
#[derive(Debug)]
pub struct Fp16Linear {
    packed: Tensor,
    bias: Option<Tensor>,
    in_features: i64,
    out_features: i64,
}

impl Fp16Linear {
    /// Pack `weight` (N, K) (any float dtype; values must fit fp16) and keep `bias` (N) in f32.
    pub fn new(weight: &Tensor, bias: Option<&Tensor>) -> Result<Self> {
        if weight.device() != Device::Cpu {
            bail!("Fp16Linear is CPU-only (weight on {:?})", weight.device());
        }
        let (out_features, in_features) = weight.size2()?;
        let w = weight.detach().to_kind(Kind::Float).contiguous();
        let max = w.abs().max().double_value(&[]);
        if max.is_nan() || max > FP16_MAX {
            bail!("a weight of magnitude {max:e} does not fit fp16 (max {FP16_MAX})");
        }
        let packed = pack(&w, temper_pack_fp16_weight, "packing an fp16 weight")?;
        Ok(Self {
            packed,
            bias: bias.map(|b| b.detach().to_kind(Kind::Float).contiguous()),
            in_features,
            out_features,
        })
    }

    /// `x (..., K) @ W^T + b` -> `(..., N)`, computed in f32 and returned in x's dtype.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.try_forward(x).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn try_forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = packed_forward(
            x,
            Some(Kind::Float),
            &self.packed,
            self.bias.as_ref(),
            (self.in_features, self.out_features),
            temper_fp16_linear,
            "fp16 linear",
        )?;
        Ok(y.to_kind(x.kind()))
    }
}

/// Whether [`Fp16Linear`] works here (PyTorch built with FBGEMM, an x86 CPU with AVX2). Probed once.
pub fn fp16_linear_available() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    *HAVE.get_or_init(|| {
        let w = Tensor::ones([16, 16], (Kind::Float, Device::Cpu));
        Fp16Linear::new(&w, None)
            .and_then(|l| l.try_forward(&Tensor::ones([2, 16], (Kind::Float, Device::Cpu))))
            .is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_linear_f32_and_bf16() {
        tch::manual_seed(0);
        // oneDNN's f32 path runs on every x86-64 CPU PyTorch supports.
        assert!(packed_linear_supports(Kind::Float));
        for kind in [Kind::Float, Kind::BFloat16] {
            let w = Tensor::randn([300, 96], (Kind::Float, Device::Cpu)).to_kind(kind);
            let b = Tensor::randn([300], (Kind::Float, Device::Cpu)).to_kind(kind);
            let x = Tensor::randn([2, 5, 96], (Kind::Float, Device::Cpu)).to_kind(kind);
            if !packed_linear_supports(kind) {
                // E.g. bf16 on an AVX2-only CPU: an error naming what is missing, not a crash.
                let e = PackedLinear::new(&w, Some(&b)).unwrap_err().to_string();
                assert!(e.contains("packing a linear weight"), "{e}");
                eprintln!("{kind:?}: not supported on this CPU, checked the error only");
                continue;
            }
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

    /// The textbook formula with the kv heads repeated (transformers' `repeat_kv`).
    fn reference_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        bias: &Tensor,
        scale: f64,
    ) -> Tensor {
        let group = q.size()[1] / k.size()[1];
        let k = k.repeat_interleave_self_int(group, Some(1), None);
        let v = v.repeat_interleave_self_int(group, Some(1), None);
        let scores =
            q.unsqueeze(2).matmul(&k.transpose(-1, -2)).squeeze_dim(2) * scale + bias.unsqueeze(1);
        scores
            .softmax(-1, Kind::Float)
            .unsqueeze(2)
            .matmul(&v)
            .squeeze_dim(2)
    }

    #[test]
    fn decode_attention_matches_the_formula() {
        tch::manual_seed(2);
        let opts = (Kind::Float, Device::Cpu);
        // (query heads, kv heads, head dim, keys): SmolLM2's 9/3 x 64, Qwen2.5's 14/2 x 128,
        // plain multi-head, and key counts on both sides of the kernel's 16-wide blocks.
        for (hq, hkv, d, s) in [
            (9, 3, 64, 37),
            (14, 2, 128, 16),
            (4, 4, 16, 5),
            (6, 2, 80, 70),
        ] {
            let (b, cap) = (3, 80);
            // A view of a bigger buffer, as the KV cache hands out.
            let kbuf = Tensor::randn([b, hkv, cap, d], opts);
            let vbuf = Tensor::randn([b, hkv, cap, d], opts);
            let (k, v) = (kbuf.narrow(2, 0, s), vbuf.narrow(2, 0, s));
            let q = Tensor::randn([b, hq, d], opts) * 3.0;
            // Row 1 masks its first 4 keys (left padding), row 2 a key in the middle.
            let bias = Tensor::zeros([b, s], opts);
            let _ = bias.get(1).narrow(0, 0, 4).fill_(f64::NEG_INFINITY);
            let _ = bias.get(2).narrow(0, 3, 1).fill_(f64::NEG_INFINITY);
            let scale = 1.0 / (d as f64).sqrt();
            let got = decode_attention(&q, &k, &v, &bias, scale).unwrap();
            let want = reference_attention(&q, &k, &v, &bias, scale);
            let diff = (&got - &want).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "{hq}/{hkv} x {d}, {s} keys: max diff {diff}");
            // A bf16 cache (views of a bf16 buffer) gives exactly what its values give in f32:
            // the kernel widens bf16 exactly.
            let (kb16, vb16) = (kbuf.to_kind(Kind::BFloat16), vbuf.to_kind(Kind::BFloat16));
            let (k16, v16) = (kb16.narrow(2, 0, s), vb16.narrow(2, 0, s));
            let got16 = decode_attention(&q, &k16, &v16, &bias, scale).unwrap();
            let widened = decode_attention(
                &q,
                &k16.to_kind(Kind::Float),
                &v16.to_kind(Kind::Float),
                &bias,
                scale,
            )
            .unwrap();
            assert_eq!(got16.kind(), Kind::Float);
            assert!(got16.equal(&widened), "{hq}/{hkv} x {d}: bf16 cache");
            // Masked keys have no influence: changing them changes nothing.
            let _ = vbuf.get(1).narrow(1, 0, 4).fill_(1e3);
            let again = decode_attention(&q, &k, &v, &bias, scale).unwrap();
            assert!(
                again.get(1).equal(&got.get(1)),
                "{hq}/{hkv} x {d}: masked keys leak"
            );
        }
    }

    #[test]
    fn decode_attention_rejects_bad_input() {
        let opts = (Kind::Float, Device::Cpu);
        let q = Tensor::zeros([1, 3, 8], opts);
        let k = Tensor::zeros([1, 2, 5, 8], opts); // 3 query heads over 2 kv heads
        let bias = Tensor::zeros([1, 5], opts);
        let e = decode_attention(&q, &k, &k, &bias, 1.0).unwrap_err();
        assert!(e.to_string().contains("do not line up"), "{e}");
        let k = Tensor::zeros([1, 1, 5, 8], opts);
        let v = Tensor::zeros([1, 1, 5, 8], (Kind::BFloat16, Device::Cpu));
        let e = decode_attention(&q, &k, &v, &bias, 1.0).unwrap_err();
        assert!(e.to_string().contains("both f32 or both bf16"), "{e}");
        let e = decode_attention(&q.to_kind(Kind::BFloat16), &k, &k, &bias, 1.0).unwrap_err();
        assert!(e.to_string().contains("q and bias f32"), "{e}");
        let q = Tensor::zeros([1, 2, 24], opts);
        let k = Tensor::zeros([1, 1, 5, 24], opts);
        assert!(!decode_attention_supports(24));
        let e = decode_attention(&q, &k, &k, &bias, 1.0).unwrap_err();
        assert!(e.to_string().contains("head dim 24"), "{e}");
    }

    #[test]
    fn fp16_linear_equals_f32_matmul_on_bf16_weights() {
        if !fp16_linear_available() {
            eprintln!("FBGEMM fp16 GEMM not available here: skipped");
            return;
        }
        tch::manual_seed(3);
        let opts = (Kind::Float, Device::Cpu);
        // bf16-valued weights (exact in fp16), f32 reference on the same numbers.
        let w = (Tensor::randn([300, 96], opts) * 0.05).to_kind(Kind::BFloat16);
        let b = Tensor::randn([300], opts).to_kind(Kind::BFloat16);
        let x = Tensor::randn([2, 5, 96], opts);
        let want = x.linear(&w.to_kind(Kind::Float), Some(&b.to_kind(Kind::Float)));
        let lin = Fp16Linear::new(&w, Some(&b)).unwrap();
        let got = lin.forward(&x);
        assert_eq!(got.size(), [2, 5, 300]);
        assert_eq!(got.kind(), Kind::Float);
        let diff = (&got - &want).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "max diff {diff}");
        // bf16 in, bf16 out: the f32 result rounded once.
        let got16 = lin.forward(&x.to_kind(Kind::BFloat16));
        assert_eq!(got16.kind(), Kind::BFloat16);
        let want16 = x
            .to_kind(Kind::BFloat16)
            .to_kind(Kind::Float)
            .linear(&w.to_kind(Kind::Float), Some(&b.to_kind(Kind::Float)));
        let diff = (got16.to_kind(Kind::Float) - &want16)
            .abs()
            .max()
            .double_value(&[]);
        let scale = want16.abs().max().double_value(&[]);
        assert!(
            diff <= scale / 128.0,
            "bf16 out: max diff {diff} at scale {scale}"
        );
        // Rows depend on the batch only by f32 rounding (FBGEMM blocks by row count).
        let x2 = Tensor::randn([40, 96], opts);
        let all = lin.forward(&x2);
        for i in [0, 17, 39] {
            let one = lin.forward(&x2.narrow(0, i, 1));
            let diff = (&one - all.narrow(0, i, 1)).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "row {i}: {diff}");
        }
        // Out of fp16's range: refused.
        let big = Tensor::full([4, 4], 1e5, opts);
        let e = Fp16Linear::new(&big, None).unwrap_err();
        assert!(e.to_string().contains("does not fit fp16"), "{e}");
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
