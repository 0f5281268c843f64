//! `swiglu_down` against the same computation as separate autograd ops (the reference: what the
//! model ran before): outputs and the gradient of every input, f32 and bf16, with and without a
//! bias and a LoRA adapter, 3-D inputs as the model passes them.

use tch::{Device, Kind, Tensor};
use temper_kernels::{swiglu_down, SwigluLora};

struct Case {
    gate: Tensor,
    up: Tensor,
    w: Tensor,
    bias: Option<Tensor>,
    lora: Option<(Tensor, Tensor, f64)>,
}

fn leaf(shape: &[i64], kind: Kind, scale: f64) -> Tensor {
    (Tensor::randn(shape, (Kind::Float, Device::Cpu)) * scale)
        .to_kind(kind)
        .set_requires_grad(true)
}

fn case(kind: Kind, bias: bool, lora: bool, frozen_w: bool) -> Case {
    let (b, t, i, o, r) = (3, 7, 40, 24, 4);
    let w = leaf(&[o, i], kind, 0.2);
    Case {
        gate: leaf(&[b, t, i], kind, 1.5),
        up: leaf(&[b, t, i], kind, 1.0),
        w: if frozen_w { w.detach() } else { w },
        bias: bias.then(|| leaf(&[o], kind, 0.1)),
        lora: lora.then(|| (leaf(&[r, i], kind, 0.3), leaf(&[o, r], kind, 0.3), 2.0)),
    }
}

/// The separate ops the model composed: `linear(silu(gate) * up)` plus the adapter's term.
fn reference(c: &Case) -> Tensor {
    let p = c.gate.silu() * &c.up;
    let y = p.linear(&c.w, c.bias.as_ref());
    match &c.lora {
        Some((a, b, scale)) => y + p.linear(a, None::<&Tensor>).linear(b, None::<&Tensor>) * *scale,
        None => y,
    }
}

fn fused(c: &Case) -> Tensor {
    let lora = c.lora.as_ref().map(|(a, b, scale)| SwigluLora {
        a,
        b,
        scale: *scale,
    });
    swiglu_down(&c.gate, &c.up, &c.w, c.bias.as_ref(), lora).unwrap()
}

fn leaves(c: &Case) -> Vec<(&'static str, &Tensor)> {
    let mut v = vec![("gate", &c.gate), ("up", &c.up), ("w", &c.w)];
    if let Some(b) = &c.bias {
        v.push(("bias", b));
    }
    if let Some((a, b, _)) = &c.lora {
        v.push(("lora_a", a));
        v.push(("lora_b", b));
    }
    v
}

/// Output and gradients of `f` for an upstream gradient `g`.
fn run(c: &Case, f: fn(&Case) -> Tensor, g: &Tensor) -> (Tensor, Vec<Tensor>) {
    for (_, t) in leaves(c) {
        let mut grad = t.grad();
        if grad.defined() {
            let _ = grad.zero_();
        }
    }
    let y = f(c);
    // d sum(y * g) / dy = g exactly.
    (&y * g).sum(y.kind()).backward();
    let grads = leaves(c)
        .into_iter()
        .map(|(_, t)| {
            if t.requires_grad() {
                t.grad().copy()
            } else {
                Tensor::new()
            }
        })
        .collect();
    (y.detach(), grads)
}

fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_kind(Kind::Double), b.to_kind(Kind::Double));
    let scale = b.abs().max().double_value(&[]).max(1e-30);
    (a - b).abs().max().double_value(&[]) / scale
}

fn check(kind: Kind, bias: bool, lora: bool, frozen_w: bool, tol: f64) {
    tch::manual_seed(17);
    let c = case(kind, bias, lora, frozen_w);
    let g = Tensor::randn([3, 7, 24], (Kind::Float, Device::Cpu)).to_kind(kind);
    let (y_ref, g_ref) = run(&c, reference, &g);
    let (y, grads) = run(&c, fused, &g);
    let what = format!("{kind:?} bias={bias} lora={lora} frozen_w={frozen_w}");
    assert_eq!(y.kind(), kind, "{what}");
    assert!(
        max_rel(&y, &y_ref) <= tol,
        "{what}: output {}",
        max_rel(&y, &y_ref)
    );
    for (((name, t), a), b) in leaves(&c).into_iter().zip(&grads).zip(&g_ref) {
        if !t.requires_grad() {
            continue;
        }
        let err = max_rel(a, b);
        assert!(
            err <= tol,
            "{what}: d/d{name} differs by {err:e} (relative)"
        );
        assert_eq!(a.size(), t.size(), "{what}: d/d{name}");
    }
}

#[test]
fn matches_separate_ops_in_f32_bit_for_bit() {
    for (bias, lora, frozen_w) in [
        (false, false, false),
        (true, false, false),
        (false, true, true),
        (true, true, false),
    ] {
        check(Kind::Float, bias, lora, frozen_w, 0.0);
    }
}

#[test]
fn matches_separate_ops_in_bf16() {
    for (bias, lora, frozen_w) in [(false, false, false), (true, true, true)] {
        check(Kind::BFloat16, bias, lora, frozen_w, 0.0);
    }
}

#[test]
fn no_grad_forward_and_bad_shapes() {
    tch::manual_seed(3);
    let c = case(Kind::Float, false, false, false);
    let y = tch::no_grad(|| fused(&c));
    assert!(!y.requires_grad());
    assert!(max_rel(&y, &tch::no_grad(|| reference(&c))) == 0.0);
    let wrong = Tensor::zeros([24, 39], (Kind::Float, Device::Cpu));
    let err = swiglu_down(&c.gate, &c.up, &wrong, None, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("swiglu_down") && err.contains("39"), "{err}");
}
