//! The cached path (prefill + one token at a time) equals the uncached forward, and `select_rows`
//! lets several samples share one prefill.
mod common;

use common::{pad, reference};
use tch::{Device, Kind, Tensor};
use temper_model::{CausalLm, ComputeKind};

/// Max |difference| of log-softmax(logits) over real (mask = 1) positions.
fn max_diff_on_mask(a: &Tensor, b: &Tensor, mask: &Tensor) -> f64 {
    let m = mask.to_kind(Kind::Float).unsqueeze(-1);
    let (la, lb) = (
        a.log_softmax(-1, Kind::Float),
        b.log_softmax(-1, Kind::Float),
    );
    f64::try_from(((la - lb) * m).abs().max()).unwrap()
}

/// Runs `b` through the cache: a prefill of `prefill` tokens, then one token at a time, inside
/// `with_sampling_weights` (fused, prepacked weights, as the rollout engine does) when `sampling`
/// is set. Returns, for the prefill (position `prefill - 1`) and each step (its position), the max
/// logprob difference from `target` (B, T, V) over real tokens.
fn cached_errors(
    model: &CausalLm,
    b: &common::Batch,
    prefill: i64,
    target: &Tensor,
    sampling: bool,
) -> Vec<(i64, f64)> {
    let t = b.ids.size()[1];
    let run = || {
        let mut cache = model.new_cache();
        let first = model.forward(
            &b.ids.narrow(1, 0, prefill),
            &b.pos.narrow(1, 0, prefill),
            &b.mask.narrow(1, 0, prefill),
            Some(&mut cache),
        );
        let (m, tgt) = (b.mask.narrow(1, 0, prefill), target.narrow(1, 0, prefill));
        let mut errors = vec![(prefill - 1, max_diff_on_mask(&first, &tgt, &m))];
        for i in prefill..t {
            assert_eq!(cache.len(), i);
            let step = model.forward(
                &b.ids.narrow(1, i, 1),
                &b.pos.narrow(1, i, 1),
                &b.mask.narrow(1, 0, i + 1),
                Some(&mut cache),
            );
            let (m, tgt) = (b.mask.narrow(1, i, 1), target.narrow(1, i, 1));
            errors.push((i, max_diff_on_mask(&step, &tgt, &m)));
        }
        errors
    };
    tch::no_grad(|| {
        if sampling {
            model.with_sampling_weights(run)
        } else {
            run()
        }
    })
}

/// The cached path, plain and with sampling weights, against the full forward (the training
/// path).
fn incremental_equals_full(name: &str, compute: ComputeKind, prefill: i64, tol: f64) {
    let r = reference(name);
    let model = CausalLm::load(&r.dir, Device::Cpu, compute).unwrap();
    let b = pad(&r.rows, true, 0, 0);
    let full = tch::no_grad(|| model.forward(&b.ids, &b.pos, &b.mask, None));
    for sampling in [false, true] {
        for (i, d) in cached_errors(&model, &b, prefill, &full, sampling) {
            assert!(
                d <= tol,
                "{name} {compute} (sampling weights: {sampling}): position {i} logits differ by {d:e}"
            );
        }
    }
}

#[test]
fn cached_decode_equals_full_forward_f32() {
    // The contract of `temper check-logprobs` is 1e-4. What remains is GEMM blocking (the number of
    // rows changes the kernel's summation order): an uncached prefix differs from the full forward
    // just as much (~3e-5 on the random llama, whose weights amplify rounding).
    incremental_equals_full("qwen2", ComputeKind::F32, 4, 1e-4);
    incremental_equals_full("qwen3", ComputeKind::F32, 1, 1e-4);
    incremental_equals_full("llama", ComputeKind::F32, 11, 1e-4);
}

/// bf16 has no fixed tolerance to hold a path to: two equally valid bf16 computations of the same
/// logits (different GEMM blockings, bf16 or f32 attention) differ by up to ~0.1 in logprob on a
/// random model, and by how much depends on the CPU's bf16 kernels (AVX-512 or AVX2). So the cached
/// bf16 decode (plain and with sampling weights) is held to the training path's own bf16 error:
/// measured against the f32 forward, it may be at most 2x as far off as the uncached bf16 forward
/// (measured 0.78-1.06x on an AVX2 CPU; a wrong position or cache row is off by far more).
#[test]
fn cached_decode_bf16_is_as_accurate_as_the_bf16_forward() {
    for (name, prefill) in [("qwen3", 5), ("qwen2", 4)] {
        let r = reference(name);
        let b = pad(&r.rows, true, 0, 0);
        let exact = CausalLm::load(&r.dir, Device::Cpu, ComputeKind::F32).unwrap();
        let model = CausalLm::load(&r.dir, Device::Cpu, ComputeKind::Bf16).unwrap();
        let (f32_full, bf16_full) = tch::no_grad(|| {
            (
                exact.forward(&b.ids, &b.pos, &b.mask, None),
                model.forward(&b.ids, &b.pos, &b.mask, None),
            )
        });
        let floor = max_diff_on_mask(&bf16_full, &f32_full, &b.mask);
        assert!(
            floor > 0.0 && floor < 0.5,
            "{name}: bf16 forward error {floor:e}"
        );
        for sampling in [false, true] {
            let worst = cached_errors(&model, &b, prefill, &f32_full, sampling)
                .into_iter()
                .map(|(_, d)| d)
                .fold(0.0, f64::max);
            eprintln!(
                "{name} bf16 (sampling weights: {sampling}): cached {worst:e}, uncached {floor:e}"
            );
            assert!(
                worst <= 2.0 * floor,
                "{name} bf16 (sampling weights: {sampling}): cached decode is {worst:e} from f32, \
                 the uncached bf16 forward {floor:e}"
            );
        }
    }
}

/// The cache holds keys and values in the compute dtype: a bf16 model's cache is half an f32
/// one's (its values are the bf16 numbers attention computed with, exact in f32 as the decode
/// reads them).
#[test]
fn the_cache_holds_the_compute_dtype() {
    let r = reference("qwen2");
    let b = pad(&r.rows, true, 0, 0);
    for (compute, kind) in [
        (ComputeKind::F32, Kind::Float),
        (ComputeKind::Bf16, Kind::BFloat16),
    ] {
        let model = CausalLm::load(&r.dir, Device::Cpu, compute).unwrap();
        for sampling in [false, true] {
            let mut cache = model.new_cache();
            assert_eq!(cache.kind(), None);
            let mut prefill = || {
                model.forward(
                    &b.ids.narrow(1, 0, 3),
                    &b.pos.narrow(1, 0, 3),
                    &b.mask.narrow(1, 0, 3),
                    Some(&mut cache),
                )
            };
            let _ = tch::no_grad(|| {
                if sampling {
                    model.with_sampling_weights(prefill)
                } else {
                    prefill()
                }
            });
            assert_eq!(
                cache.kind(),
                Some(kind),
                "{compute}, sampling weights: {sampling}"
            );
        }
    }
}

/// Feeds row `s` of `cache` (its mask `mask`) the tokens `conts[s]`, one step at a time, then checks
/// each row's last logits against a full forward of `prefixes[s] + conts[s]` on its own.
fn continue_rows_and_compare(
    model: &CausalLm,
    cache: &mut temper_model::KvCache,
    mut mask: Tensor,
    prefixes: &[Vec<i64>],
    conts: &[Vec<i64>],
) {
    let (rows, steps) = (conts.len() as i64, conts[0].len());
    let start_len = cache.len();
    let prompt_len = mask.sum_dim_intlist([1i64].as_slice(), false, Kind::Int64);
    let mut last = None;
    for step in 0..steps {
        let ids = Tensor::from_slice(&conts.iter().map(|c| c[step]).collect::<Vec<_>>());
        mask = Tensor::cat(
            &[&mask, &Tensor::ones([rows, 1], (Kind::Int64, Device::Cpu))],
            1,
        );
        let pos = (&prompt_len + step as i64).view([rows, 1]);
        last = Some(model.forward(&ids.view([rows, 1]), &pos, &mask, Some(cache)));
    }
    assert_eq!(cache.len(), start_len + steps as i64);
    let last = last.unwrap();
    for (s, (prefix, cont)) in prefixes.iter().zip(conts).enumerate() {
        let one = pad(&[[prefix.as_slice(), cont].concat()], false, 0, 0);
        let full = model.forward(&one.ids, &one.pos, &one.mask, None);
        let (a, b) = (
            full.get(0).get(-1).log_softmax(-1, Kind::Float),
            last.get(s as i64).get(0).log_softmax(-1, Kind::Float),
        );
        let d = f64::try_from((a - b).abs().max()).unwrap();
        assert!(d <= 1e-4, "row {s}: cached logits differ by {d:e}");
    }
}

/// Two prompts prefilled once, expanded to three samples with `select_rows`, each continued with its
/// own tokens: the logits equal a full forward of each whole sequence on its own.
#[test]
fn select_rows_shares_a_prefill() {
    let r = reference("qwen2");
    let model = CausalLm::load(&r.dir, Device::Cpu, ComputeKind::F32).unwrap();
    let prompts = vec![r.rows[0][..5].to_vec(), r.rows[1].clone()];
    let conts: Vec<Vec<i64>> = vec![vec![11, 12, 13], vec![21, 22, 23], vec![31, 32, 33]];
    let owner = [0usize, 0, 1];
    let p = pad(&prompts, true, 0, 0);
    tch::no_grad(|| {
        let mut cache = model.new_cache();
        let _ = model.forward(&p.ids, &p.pos, &p.mask, Some(&mut cache));
        let rows = Tensor::from_slice(&[0i64, 0, 1]);
        cache.select_rows(&rows);
        let mask = p.mask.index_select(0, &rows);
        let prefixes: Vec<Vec<i64>> = owner.iter().map(|&o| prompts[o].clone()).collect();
        continue_rows_and_compare(&model, &mut cache, mask, &prefixes, &conts);
    });
}

/// Two caches of different lengths (one short prompt; two longer, left-padded prompts) stacked with
/// `merge_rows` and decoded together: each row's logits equal a full forward of its whole sequence
/// on its own, so moving a row's cache slots right changes nothing.
#[test]
fn merge_rows_stacks_caches_of_different_lengths() {
    let r = reference("qwen2");
    let model = CausalLm::load(&r.dir, Device::Cpu, ComputeKind::F32).unwrap();
    let prompts = vec![
        r.rows[0][..3].to_vec(),
        r.rows[1].clone(),
        r.rows[0][..6].to_vec(),
    ];
    let conts: Vec<Vec<i64>> = vec![vec![11, 12], vec![21, 22], vec![31, 32]];
    tch::no_grad(|| {
        let (a, b) = (
            pad(&prompts[..1], true, 0, 0),
            pad(&prompts[1..], true, 0, 0),
        );
        let (mut ca, mut cb) = (model.new_cache(), model.new_cache());
        let _ = model.forward(&a.ids, &a.pos, &a.mask, Some(&mut ca));
        let _ = model.forward(&b.ids, &b.pos, &b.mask, Some(&mut cb));
        assert!(
            ca.len() < cb.len(),
            "the test needs caches of different lengths"
        );
        let (len, a_len) = (cb.len(), ca.len());
        let mut cache = temper_model::KvCache::merge_rows(ca, cb, len + 2);
        assert_eq!(cache.len(), len);
        let zeros = Tensor::zeros([1, len - a_len], (Kind::Int64, Device::Cpu));
        let mask = Tensor::cat(
            &[Tensor::cat(&[&zeros, &a.mask], 1), b.mask.shallow_clone()],
            0,
        );
        continue_rows_and_compare(&model, &mut cache, mask, &prompts, &conts);
    });
}

/// A cache reserved up front and one grown step by step give identical numbers.
#[test]
fn preallocated_and_growing_caches_agree() {
    let r = reference("llama");
    let model = CausalLm::load(&r.dir, Device::Cpu, ComputeKind::F32).unwrap();
    let b = pad(&r.rows, true, 0, 0);
    let t = b.ids.size()[1];
    tch::no_grad(|| {
        let mut grow = model.new_cache();
        let mut big = temper_model::KvCache::with_capacity(model.num_layers(), t);
        for i in 0..t {
            let args = (
                b.ids.narrow(1, i, 1),
                b.pos.narrow(1, i, 1),
                b.mask.narrow(1, 0, i + 1),
            );
            let a = model.forward(&args.0, &args.1, &args.2, Some(&mut grow));
            let c = model.forward(&args.0, &args.1, &args.2, Some(&mut big));
            assert!(
                a.equal(&c),
                "step {i}: growing and preallocated caches differ"
            );
        }
    });
}

/// Inside `with_sampling_weights` an uncached forward stays within rounding of the training path,
/// for every architecture flag (qwen2: q/k/v biases fused; qwen3: q/k norms; llama: plain); once
/// the call returns, the training path is back, bitwise.
#[test]
fn sampling_weights_are_close_and_temporary() {
    for (name, compute, tol) in [
        ("qwen2", ComputeKind::F32, 1e-4),
        ("qwen3", ComputeKind::F32, 1e-4),
        ("llama", ComputeKind::F32, 1e-4),
        ("qwen3", ComputeKind::Bf16, 0.1),
    ] {
        let r = reference(name);
        let model = CausalLm::load(&r.dir, Device::Cpu, compute).unwrap();
        let b = pad(&r.rows, true, 0, 0);
        tch::no_grad(|| {
            let plain = model.forward(&b.ids, &b.pos, &b.mask, None);
            assert_eq!(model.sampling_weights_layout(), None);
            let frozen = model.with_sampling_weights(|| {
                // PyTorch's x86 wheels ship oneDNN, and the test venv uses one; its bf16 path
                // needs AVX-512 (an AVX2-only CPU keeps fused plain copies in bf16).
                let kind = compute.kind();
                let want = if temper_kernels::packed_linear_supports(kind) {
                    "onednn-packed"
                } else if kind == Kind::BFloat16 && temper_kernels::fp16_linear_available() {
                    "fbgemm-fp16"
                } else {
                    "fused"
                };
                assert_eq!(model.sampling_weights_layout(), Some(want));
                model.forward(&b.ids, &b.pos, &b.mask, None)
            });
            let d = max_diff_on_mask(&plain, &frozen, &b.mask);
            assert!(
                d <= tol,
                "{name} {compute}: sampling weights differ by {d:e}"
            );
            let after = model.forward(&b.ids, &b.pos, &b.mask, None);
            assert!(plain.equal(&after), "{name}: training path changed");
        });
    }
}
