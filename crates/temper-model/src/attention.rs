//! Attention and its masks: scaled dot-product attention as training computes it, decode-time
//! attention over the KV cache, and the 4-D mask and position ids built from a padding mask.
use tch::{Kind, Tensor};

/// `softmax(q k^T / sqrt(d) + mask) v` with grouped-query heads, as the training path computes it.
pub(crate) fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Tensor {
    Tensor::scaled_dot_product_attention(q, k, v, Some(mask), 0.0, false, None, true)
}

/// Attention over a KV cache on CPU, in f32: q (B, Hq, T, d) in the compute dtype, k and v
/// (B, Hkv, S, d) views of the cache, which holds them in the compute dtype (f32 or bf16; a bf16
/// number is exact in f32, so keeping the cache in bf16 halves it and what each decode step reads
/// without changing a result). Returns (B, Hq, T, d) f32.
///
/// Why f32: with bf16 compute, libtorch's CPU flash attention multiplies q and k through MKL's
/// generic bf16 gemv (a third of a bf16 decode step on this project's AMD CPU); f32 values of the
/// same bf16 numbers take optimised paths and round less. For one new token (`decode_bias`, the
/// mask as a (B, S) additive bias) the query heads that share a kv head are batched into one
/// matmul against it (flash attention runs a gemv per head); on CPUs with AVX-512,
/// [`temper_kernels::decode_attention`] does the same in one pass over the cache.
pub(crate) fn attend_cached(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    decode_bias: Option<&Tensor>,
) -> Tensor {
    let q = q.to_kind(Kind::Float);
    let widen = |x: &Tensor| x.to_kind(Kind::Float);
    let Some(bias) = decode_bias else {
        return sdpa(&q, &widen(k), &widen(v), mask);
    };
    let [b, n_q, t, d] = q.size()[..] else {
        unreachable!("q is 4-D")
    };
    let scale = 1.0 / (d as f64).sqrt();
    if temper_kernels::decode_attention_is_fast() && temper_kernels::decode_attention_supports(d) {
        // The kernel reads a bf16 cache as it is, widening each value as it loads it.
        let out = temper_kernels::decode_attention(&q.reshape([b, n_q, d]), k, v, bias, scale);
        return out.unwrap_or_else(|e| panic!("{e}")).view([b, n_q, t, d]);
    }
    let (k, v) = (widen(k), widen(v));
    // The same formula in matmuls; query head h uses kv head h / group
    // (transformers' repeat_kv), so (B, Hq, 1, d) viewed as (B, Hkv, group, d) lines them up.
    let n_kv = k.size()[1];
    let q = q.reshape([b, n_kv, n_q / n_kv, d]);
    let scores = q.matmul(&k.transpose(-1, -2)) * scale + bias.view([b, 1, 1, -1]);
    scores
        .softmax(-1, Kind::Float)
        .matmul(&v)
        .reshape([b, n_q, t, d])
}

/// How the fixed-shape decode step attends on a GPU (`TEMPER_DECODE_ATTENTION`, read once):
/// `sdpa` (default) libtorch's scaled-dot-product attention with the additive mask (it picks its
/// own kernel: memory-efficient or math, flash and cuDNN take no mask); `matmul` the query heads
/// of each kv head batched into one matmul against its keys, scores and softmax in f32. Measured
/// on an H200 with the steps replayed as CUDA graphs (SmolLM2, bf16, decode tok/s at 1/16/64/256
/// rows): sdpa 414 / 5,376 / 13,948 / 22,694, matmul 375 / 4,592 / 13,276 / 23,084 (BENCHMARKS.md,
/// "On an H200").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeAttention {
    Matmul,
    Sdpa,
}

impl DecodeAttention {
    pub fn from_env() -> Self {
        static CHOICE: std::sync::OnceLock<DecodeAttention> = std::sync::OnceLock::new();
        *CHOICE.get_or_init(
            || match std::env::var("TEMPER_DECODE_ATTENTION").as_deref() {
                Ok("matmul") => DecodeAttention::Matmul,
                _ => DecodeAttention::Sdpa,
            },
        )
    }
}

/// One new token per row (q (B, Hq, 1, d)) over a fixed-shape cache (k, v (B, Hkv, S, d), every
/// slot, filled or not) with `bias` (B, S) f32, 0 for the keys a row attends and -inf for the
/// rest ([`crate::static_decode`]). On the CPU, [`attend_cached`]'s one-token path (the same
/// numbers as the growing cache's decode over the filled positions: the extra keys weigh
/// exp(-inf) = 0). Returns (B, Hq, 1, d), f32 on the CPU and the compute dtype on a GPU.
pub(crate) fn attend_fixed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    on_cpu: bool,
) -> Tensor {
    if on_cpu {
        return attend_cached(q, k, v, bias, Some(bias));
    }
    let [b, n_q, t, d] = q.size()[..] else {
        unreachable!("q is 4-D")
    };
    let n_kv = k.size()[1];
    let s = k.size()[2];
    let scale = 1.0 / (d as f64).sqrt();
    match DecodeAttention::from_env() {
        DecodeAttention::Sdpa => {
            let mask = bias.view([b, 1, 1, s]).to_kind(q.kind());
            Tensor::scaled_dot_product_attention(q, k, v, Some(&mask), 0.0, false, None, true)
        }
        DecodeAttention::Matmul => {
            // Query head h uses kv head h / group (transformers' repeat_kv).
            let q = q.reshape([b, n_kv, n_q / n_kv, d]);
            let scores = q.matmul(&k.transpose(-1, -2)).to_kind(Kind::Float) * scale
                + bias.view([b, 1, 1, s]);
            scores
                .softmax(-1, Kind::Float)
                .to_kind(v.kind())
                .matmul(v)
                .reshape([b, n_q, t, d])
        }
    }
}

/// Boolean (B, 1, T, S) mask, true where query i (at absolute position past+i) may attend key j:
/// `j <= past + i && (key j is real || j == past + i)`.
pub fn attention_mask_4d(attention_mask: &Tensor, t: i64, past: i64) -> Tensor {
    let (b, s) = attention_mask.size2().expect("attention_mask must be 2-D");
    let dev = attention_mask.device();
    let q_pos = Tensor::arange_start(past, past + t, (Kind::Int64, dev)).view([t, 1]);
    let k_pos = Tensor::arange(s, (Kind::Int64, dev)).view([1, s]);
    let causal = k_pos.le_tensor(&q_pos).view([1, 1, t, s]);
    let own = k_pos.eq_tensor(&q_pos).view([1, 1, t, s]);
    let real = attention_mask.ne(0).view([b, 1, 1, s]);
    causal.logical_and(&real).logical_or(&own)
}

/// Position ids (B, T) for a 0/1 mask (B, T): `cumsum(mask) - 1`, clamped at 0 on left padding.
pub fn position_ids_from_mask(attention_mask: &Tensor) -> Tensor {
    (attention_mask.to_kind(Kind::Int64).cumsum(1, Kind::Int64) - 1).clamp_min(0)
}

/// Boolean (B, 1, L, W + L) mask of packed rows ([`crate::packed`]): several sequences side by
/// side in one row, `segments` (B, L) naming each token's sequence (1, 2, ... within its row; 0
/// for padding). Query i attends key j of its own row when both belong to the same sequence and
/// `j <= i`; it always attends to itself (a pad query's softmax is never empty). With `past`
/// ((B, W) groups of earlier keys, (B, L) the group each query attends to there; 0 = none), query
/// i also attends every earlier key of its group: a response sees its whole prompt.
pub fn packed_attention_mask(segments: &Tensor, past: Option<(&Tensor, &Tensor)>) -> Tensor {
    let (b, l) = segments.size2().expect("segments must be (B, L)");
    let dev = segments.device();
    let pos = Tensor::arange(l, (Kind::Int64, dev));
    let causal = pos
        .view([1, l])
        .le_tensor(&pos.view([l, 1]))
        .view([1, 1, l, l]);
    let own = pos
        .view([1, l])
        .eq_tensor(&pos.view([l, 1]))
        .view([1, 1, l, l]);
    let key = segments.view([b, 1, 1, l]);
    let same = segments
        .view([b, 1, l, 1])
        .eq_tensor(&key)
        .logical_and(&key.ne(0));
    let rows = same.logical_and(&causal).logical_or(&own);
    match past {
        None => rows,
        Some((past_groups, query_groups)) => {
            let w = past_groups.size()[1];
            let key = past_groups.view([b, 1, 1, w]);
            let earlier = query_groups
                .view([b, 1, l, 1])
                .eq_tensor(&key)
                .logical_and(&key.ne(0));
            Tensor::cat(&[earlier, rows], 3)
        }
    }
}
