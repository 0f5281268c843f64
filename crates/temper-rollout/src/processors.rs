//! Logits processors on a `(rows, vocab)` f32 tensor, each row with its own settings.
//!
//! Order (the same as transformers' `generate` and vLLM): repetition penalty, ban tokens
//! (`min_tokens`), temperature, top-k, top-p. Removed tokens get `-inf`.

use tch::{Kind, Tensor};

/// Per-row repetition penalty: `seen[r]` lists the (unique) ids already in row `r`'s sequence.
/// A seen token's logit `l` becomes `l / p` if `l > 0` else `l * p` (HF/vLLM). Rows with
/// `p == 1` are untouched.
pub fn repetition_penalty(logits: &Tensor, penalties: &[f64], seen: &[&[i64]]) -> Tensor {
    assert_eq!(penalties.len(), seen.len());
    if penalties.iter().all(|&p| p == 1.0) {
        return logits.shallow_clone();
    }
    // Every penalised (row, id) as one flat index and its row's penalty: one copy to the device
    // and three batched ops, whatever the number of rows.
    let vocab = logits.size()[1];
    let mut flat: Vec<i64> = Vec::new();
    let mut factor: Vec<f32> = Vec::new();
    for (r, (&p, ids)) in penalties.iter().zip(seen).enumerate() {
        if p == 1.0 {
            continue;
        }
        flat.extend(ids.iter().map(|&id| r as i64 * vocab + id));
        factor.extend(std::iter::repeat_n(p as f32, ids.len()));
    }
    if flat.is_empty() {
        return logits.shallow_clone();
    }
    let device = logits.device();
    let flat = Tensor::from_slice(&flat).to_device(device);
    let factor = Tensor::from_slice(&factor).to_device(device);
    let out = logits.copy();
    let mut cells = out.view([-1]);
    let got = cells.index_select(0, &flat);
    let penalised = (&got / &factor).where_self(&got.gt(0.0), &(&got * &factor));
    let _ = cells.index_copy_(0, &flat, &penalised);
    out
}

/// Sets `-inf` at `banned[r]` in row `r` (EOS / stop token ids while below `min_tokens`).
pub fn ban_tokens(logits: &Tensor, banned: &[&[i64]]) -> Tensor {
    if banned.iter().all(|b| b.is_empty()) {
        return logits.shallow_clone();
    }
    // One flat index per banned (row, id), one copy to the device and one fill for every row.
    let vocab = logits.size()[1];
    let flat: Vec<i64> = banned
        .iter()
        .enumerate()
        .flat_map(|(r, ids)| ids.iter().map(move |&id| r as i64 * vocab + id))
        .collect();
    let out = logits.copy();
    let flat = Tensor::from_slice(&flat).to_device(logits.device());
    let _ = out.view([-1]).index_fill_(0, &flat, f64::NEG_INFINITY);
    out
}

/// Divides row `r` by `temperatures[r]`; a temperature of 0 (greedy) is treated as 1.
pub fn temperature(logits: &Tensor, temperatures: &[f64]) -> Tensor {
    if temperatures.iter().all(|&t| t == 0.0 || t == 1.0) {
        return logits.shallow_clone();
    }
    let t: Vec<f32> = temperatures
        .iter()
        .map(|&t| if t == 0.0 { 1.0 } else { t as f32 })
        .collect();
    let t = Tensor::from_slice(&t)
        .to_device(logits.device())
        .unsqueeze(1);
    logits / t
}

/// Top-k then top-p (on the top-k-renormalised distribution), per row.
///
/// `top_k[r] = None` keeps every token; `top_p[r] >= 1` keeps every token. Top-p keeps a token iff
/// the probability mass of the tokens ranked strictly above it is `< top_p`, so the most likely
/// token is always kept (equivalent to transformers' `TopPLogitsWarper` up to ties).
pub fn top_k_top_p(logits: &Tensor, top_k: &[Option<usize>], top_p: &[f64]) -> Tensor {
    let (rows, vocab) = logits.size2().expect("logits must be (rows, vocab)");
    assert_eq!((top_k.len(), top_p.len()), (rows as usize, rows as usize));
    let k_active = top_k.iter().any(|k| k.is_some_and(|k| (k as i64) < vocab));
    let p_active = top_p.iter().any(|&p| p < 1.0);
    if !k_active && !p_active {
        return logits.shallow_clone();
    }
    let device = logits.device();
    let (mut sorted, order) = logits.sort(-1, true);
    let rank = Tensor::arange(vocab, (Kind::Int64, device)).unsqueeze(0);
    if k_active {
        let ks: Vec<i64> = top_k
            .iter()
            .map(|k| k.map_or(vocab, |k| (k as i64).min(vocab)))
            .collect();
        let ks = Tensor::from_slice(&ks).to_device(device).unsqueeze(1);
        sorted = sorted.masked_fill(&rank.ge_tensor(&ks), f64::NEG_INFINITY);
    }
    if p_active {
        // p >= 1 must keep everything: cumulative sums can round to >= 1 before the last token.
        let ps: Vec<f32> = top_p
            .iter()
            .map(|&p| if p >= 1.0 { 2.0 } else { p as f32 })
            .collect();
        let ps = Tensor::from_slice(&ps).to_device(device).unsqueeze(1);
        let probs = sorted.softmax(-1, Kind::Float);
        let mass_above = probs.cumsum(-1, Kind::Float) - &probs;
        sorted = sorted.masked_fill(&mass_above.ge_tensor(&ps), f64::NEG_INFINITY);
    }
    logits
        .full_like(f64::NEG_INFINITY)
        .scatter(-1, &order, &sorted)
}
