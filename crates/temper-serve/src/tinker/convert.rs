//! From the SDK's wire shapes to temper-tinker's: protobuf datums, JSON model inputs and
//! sampling params, `tinker://` paths. Errors name the datum index and the field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use temper_tinker::{Datum, Provenance, Span, SpanSource, TensorData, TinkerSamplingParams};

use super::proto;

/// The tokens of a model input's chunks, joined in order (only `encoded_text` chunks).
pub fn proto_tokens(chunks: &[proto::Chunk], field: &str) -> Result<Vec<i64>> {
    let mut out = vec![];
    for (k, c) in chunks.iter().enumerate() {
        match &c.chunk {
            Some(proto::chunk::Chunk::EncodedText(t)) => {
                let v = proto::le_values(&t.tokens, 4, |b| {
                    i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64
                })
                .with_context(|| format!("{field}.chunks[{k}].tokens: not int32 values"))?;
                out.extend(v);
            }
            Some(_) => bail!(
                "{field}.chunks[{k}]: only encoded_text chunks are supported (no images or audio)"
            ),
            None => bail!("{field}.chunks[{k}]: empty chunk"),
        }
    }
    Ok(out)
}

/// A protobuf tensor as int64 or float32 values, row-major, and its K when it is (N, K). A
/// sparse CSR tensor (the SDK sends 2-D `target_tokens` and `weights` so when that is smaller)
/// comes back dense, its implicit cells 0.
fn tensor_values(t: &proto::Tensor, field: &str) -> Result<(TensorData, usize)> {
    let width = match t.shape.as_slice() {
        [] | [_] => 1,
        [_, k] if *k >= 1 => *k as usize,
        s => bail!("{field}: shape {s:?}: only (N,) and (N, K) tensors are taken"),
    };
    let values = match &t.encoding {
        Some(proto::tensor::Encoding::Dense(bytes)) => values_of(bytes, t.dtype, field)?,
        Some(proto::tensor::Encoding::SparseCsr(csr)) => sparse_values(csr, t, field)?,
        None => bail!("{field}: the tensor has no data"),
    };
    if let [rows, cols] = t.shape.as_slice() {
        if (*rows as u128) * (*cols as u128) != values.len() as u128 {
            bail!(
                "{field}: shape [{rows}, {cols}] but {} values",
                values.len()
            );
        }
    }
    Ok((values, width))
}

/// A (rows x cols) CSR matrix as dense row-major values.
fn sparse_values(csr: &proto::SparseCsr, t: &proto::Tensor, field: &str) -> Result<TensorData> {
    let [rows, cols] = t.shape.as_slice() else {
        bail!(
            "{field}: a sparse_csr tensor needs a 2-D shape, got {:?}",
            t.shape
        );
    };
    let (rows, cols) = (*rows, *cols);
    if rows < 0 || cols < 0 || (rows as u128) * (cols as u128) > (1u128 << 31) {
        bail!("{field}: sparse_csr shape [{rows}, {cols}] is out of range");
    }
    let (rows, cols) = (rows as usize, cols as usize);
    let ints = |b: &[u8], what: &str| -> Result<Vec<i64>> {
        proto::le_values(b, 8, |x| i64::from_le_bytes(x.try_into().expect("8")))
            .with_context(|| format!("{field}.sparse_csr.{what}: not int64 values"))
    };
    let crow = ints(&csr.crow_indices, "crow_indices")?;
    let col = ints(&csr.col_indices, "col_indices")?;
    let values = values_of(&csr.values, t.dtype, &format!("{field}.sparse_csr.values"))?;
    if crow.len() != rows + 1 || col.len() != values.len() {
        bail!(
            "{field}.sparse_csr: {} crow_indices for {rows} rows, {} col_indices for {} values",
            crow.len(),
            col.len(),
            values.len()
        );
    }
    let mut cell = vec![None; rows * cols];
    for r in 0..rows {
        let (a, b) = (crow[r], crow[r + 1]);
        if a < 0 || b < a || b as usize > col.len() {
            bail!(
                "{field}.sparse_csr.crow_indices[{r}..{}] = {a}..{b} is out of order or range",
                r + 1
            );
        }
        for (j, &c) in col.iter().enumerate().take(b as usize).skip(a as usize) {
            if c < 0 || c as usize >= cols {
                bail!("{field}.sparse_csr.col_indices[{j}] = {c} is outside 0..{cols}");
            }
            cell[r * cols + c as usize] = Some(j);
        }
    }
    Ok(match values {
        TensorData::I64(v) => TensorData::I64(cell.iter().map(|j| j.map_or(0, |j| v[j])).collect()),
        TensorData::F32(v) => {
            TensorData::F32(cell.iter().map(|j| j.map_or(0.0, |j| v[j])).collect())
        }
    })
}

/// Little-endian values of protobuf dtype `dtype`.
fn values_of(bytes: &[u8], dtype: i32, field: &str) -> Result<TensorData> {
    let bad = || {
        format!(
            "{field}: {} bytes do not hold whole values of its dtype",
            bytes.len()
        )
    };
    Ok(match proto::DType::try_from(dtype) {
        Ok(proto::DType::Int64) => TensorData::I64(
            proto::le_values(bytes, 8, |b| i64::from_le_bytes(b.try_into().expect("8")))
                .with_context(bad)?,
        ),
        Ok(proto::DType::Int32) => TensorData::I64(
            proto::le_values(bytes, 4, |b| {
                i32::from_le_bytes(b.try_into().expect("4")) as i64
            })
            .with_context(bad)?,
        ),
        Ok(proto::DType::Float32) => TensorData::F32(
            proto::le_values(bytes, 4, |b| f32::from_le_bytes(b.try_into().expect("4")))
                .with_context(bad)?,
        ),
        Ok(proto::DType::Bfloat16) => TensorData::F32(
            proto::le_values(bytes, 2, |b| {
                f32::from_bits((u16::from_le_bytes(b.try_into().expect("2")) as u32) << 16)
            })
            .with_context(bad)?,
        ),
        _ => bail!("{field}: unsupported dtype {dtype}"),
    })
}

/// The request's datums.
pub fn datums(data: &[proto::Datum]) -> Result<Vec<Datum>> {
    data.iter()
        .enumerate()
        .map(|(i, d)| {
            let model_input = proto_tokens(&d.model_input, &format!("datum {i}: model_input"))?;
            let mut loss_fn_inputs = BTreeMap::new();
            let mut widths = BTreeMap::new();
            for (name, t) in &d.loss_fn_inputs {
                let (v, k) = tensor_values(t, &format!("datum {i}: loss_fn_inputs.{name}"))?;
                loss_fn_inputs.insert(name.clone(), v);
                if k > 1 {
                    widths.insert(name.clone(), k);
                }
            }
            let mut datum = Datum::new(model_input, loss_fn_inputs);
            datum.widths = widths;
            datum.provenance = provenance(i, d)?;
            Ok(datum)
        })
        .collect()
}

/// The datum's provenance: both span lists or neither (as the SDK sends them).
fn provenance(i: usize, d: &proto::Datum) -> Result<Option<Provenance>> {
    let (inputs, targets) = (&d.model_input_spans, &d.loss_fn_input_spans);
    if inputs.is_empty() && targets.is_empty() {
        return Ok(None);
    }
    if inputs.is_empty() != targets.is_empty() {
        bail!(
            "datum {i}: model_input_spans and loss_fn_input_spans come as a pair: both or neither"
        );
    }
    let runs = |field: &str, spans: &[proto::ProvenanceSpan]| -> Result<Vec<Span>> {
        spans
            .iter()
            .enumerate()
            .map(|(k, s)| {
                let (source, run) = match &s.span {
                    Some(proto::provenance_span::Span::PromptTokens(r)) => (SpanSource::Prompt, r),
                    Some(proto::provenance_span::Span::SampledTokens(r)) => {
                        (SpanSource::Sampled, r)
                    }
                    None => {
                        bail!("datum {i}: {field}[{k}]: neither prompt_tokens nor sampled_tokens")
                    }
                };
                if run.sequence_id.is_empty() {
                    bail!("datum {i}: {field}[{k}]: sequence_id is empty");
                }
                Ok(Span {
                    source,
                    sequence_id: run.sequence_id.clone(),
                    offset: run.offset,
                    length: run.length,
                })
            })
            .collect()
    };
    Ok(Some(Provenance {
        model_input: runs("model_input_spans", inputs)?,
        targets: runs("loss_fn_input_spans", targets)?,
    }))
}

/// `loss_fn_config`: the numbers of v2 (preferred) or of the legacy map.
pub fn loss_config(r: &proto::ForwardBackwardRequest) -> Result<BTreeMap<String, f64>> {
    let mut out: BTreeMap<String, f64> = r
        .loss_fn_config
        .iter()
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    for (k, v) in &r.loss_fn_config_v2 {
        match &v.value {
            Some(proto::loss_config_value::Value::Number(x)) => {
                out.insert(k.clone(), *x);
            }
            Some(proto::loss_config_value::Value::Text(t)) => {
                bail!(
                    "loss_fn_config.{k}: text values ({t:?}) are not supported by temper's losses"
                )
            }
            None => {}
        }
    }
    Ok(out)
}

/// A JSON `ModelInput` (`{"chunks": [{"tokens": [...], "type": "encoded_text"}, ...]}`).
pub fn json_tokens(v: &Value, field: &str) -> Result<Vec<i64>> {
    let Some(chunks) = v["chunks"].as_array() else {
        bail!("{field}.chunks: missing");
    };
    let mut out = vec![];
    for (k, c) in chunks.iter().enumerate() {
        if c["type"].as_str().unwrap_or("encoded_text") != "encoded_text" {
            bail!(
                "{field}.chunks[{k}]: only encoded_text chunks are supported (no images or audio)"
            );
        }
        let t: Vec<i64> = serde_json::from_value(c["tokens"].clone())
            .with_context(|| format!("{field}.chunks[{k}].tokens: not token ids"))?;
        out.extend(t);
    }
    Ok(out)
}

/// Tinker's `sampling_params`. The SDK leaves out fields that are None: a missing `max_tokens`
/// samples up to `context_left` tokens (the rest of the context, as vLLM's and SGLang's chat
/// routes do; hosted Tinker documents no default), and `stop: []` (unlike a missing `stop`) turns
/// EOS off too, as the SDK documents. Strings or token ids in `stop` stop as well.
pub fn sampling_params(v: &Value, context_left: usize) -> Result<TinkerSamplingParams> {
    let d = TinkerSamplingParams::default();
    let num = |k: &str| -> Result<Option<f64>> {
        match &v[k] {
            Value::Null => Ok(None),
            x => x
                .as_f64()
                .map(Some)
                .with_context(|| format!("sampling_params.{k}: not a number")),
        }
    };
    let (mut stop_tokens, mut stop_strings) = (vec![], vec![]);
    let ignore_eos = v["stop"].as_array().is_some_and(|a| a.is_empty());
    match &v["stop"] {
        Value::Null => {}
        Value::String(s) => stop_strings.push(s.clone()),
        Value::Array(items) => {
            for (k, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) => stop_strings.push(s.clone()),
                    Value::Number(n) if n.as_i64().is_some() => {
                        stop_tokens.push(n.as_i64().unwrap_or(0))
                    }
                    _ => bail!("sampling_params.stop[{k}]: not a string or a token id"),
                }
            }
        }
        _ => bail!("sampling_params.stop: not a string or a list"),
    }
    let max_tokens = match &v["max_tokens"] {
        // Without max_tokens a sample runs to the end of the context: a prompt that already
        // fills it leaves no room, which is the prompt's fault, not a field the client sent.
        Value::Null if context_left == 0 => bail!(
            "prompt: it fills the model's whole context (--max-model-len), so no token can be \
             sampled; shorten the prompt or start the server with a larger --max-model-len"
        ),
        Value::Null => context_left,
        x => x
            .as_u64()
            .map(|m| m.min(usize::MAX as u64) as usize)
            .with_context(|| {
                format!("sampling_params.max_tokens: {x} is not a non-negative integer")
            })?,
    };
    let top_k = match &v["top_k"] {
        Value::Null => d.top_k,
        x => x
            .as_i64()
            .with_context(|| format!("sampling_params.top_k: {x} is not an integer"))?,
    };
    // Any integer seeds (a negative one by its two's-complement bits); anything else is refused,
    // never dropped.
    let seed = match &v["seed"] {
        Value::Null => None,
        x => Some(
            x.as_u64()
                .or_else(|| x.as_i64().map(|i| i as u64))
                .with_context(|| format!("sampling_params.seed: {x} is not an integer"))?,
        ),
    };
    Ok(TinkerSamplingParams {
        max_tokens,
        temperature: num("temperature")?.unwrap_or(d.temperature),
        top_p: num("top_p")?.unwrap_or(d.top_p),
        top_k,
        stop_tokens,
        stop_strings,
        ignore_eos,
        seed,
    })
}

/// `tinker://{model_id}/{kind}/{name}` -> (model_id, kind, name).
pub fn parse_tinker_path(path: &str) -> Result<(String, String, String)> {
    let rest = path
        .strip_prefix("tinker://")
        .with_context(|| format!("path {path:?}: not a tinker:// path"))?;
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        // No empty, `.` or `..` parts: a path never leaves `--root`.
        [model, kind @ ("weights" | "sampler_weights"), name]
            if [model, name].iter().all(|p| !matches!(**p, "" | "." | "..")) =>
        {
            Ok((model.to_string(), kind.to_string(), name.to_string()))
        }
        _ => bail!("path {path:?}: expected tinker://MODEL_ID/weights/NAME or tinker://MODEL_ID/sampler_weights/NAME"),
    }
}

/// Where `path` lives under the server's root, checked to exist.
pub fn checkpoint_dir(root: &Path, path: &str) -> Result<PathBuf> {
    let (model, kind, name) = parse_tinker_path(path)?;
    let dir = root.join(&model).join(&kind).join(&name);
    // A save killed between its renames left the previous version aside: put it back.
    temper_base::atomic_dir::restore_interrupted(&dir).with_context(|| format!("path {path:?}"))?;
    if !dir.is_dir() {
        bail!(
            "path {path:?}: no such checkpoint (looked in {})",
            dir.display()
        );
    }
    Ok(dir)
}

#[cfg(test)]
mod path_tests {
    use super::*;

    #[test]
    fn tinker_paths_never_leave_the_root() {
        let (m, k, n) = parse_tinker_path("tinker://sess-1-0:train:0/weights/ckpt").unwrap();
        assert_eq!(
            (m.as_str(), k.as_str(), n.as_str()),
            ("sess-1-0:train:0", "weights", "ckpt")
        );
        for bad in [
            "tinker://../weights/x",
            "tinker://m/weights/..",
            "tinker://./sampler_weights/x",
            "tinker://m/weights/a/../../b",
            "tinker://m/other/x",
            "tinker:///weights/x",
            "file:///etc",
        ] {
            assert!(parse_tinker_path(bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod sampling_tests {
    use super::*;
    use serde_json::json;

    /// A (3 x 4) sparse CSR matrix, as torch's `to_sparse_csr` lays out what the SDK sends for a
    /// 2-D `weights` tensor, comes back dense and row-major; bad indices are refused by name.
    #[test]
    fn sparse_csr_tensors_come_back_dense() {
        // [[0, 1.5, 0, 0], [0, 0, 0, 0], [2, 0, 0, -1]]
        let csr = |crow: Vec<i64>, col: Vec<i64>| proto::Tensor {
            encoding: Some(proto::tensor::Encoding::SparseCsr(proto::SparseCsr {
                values: proto::f32_bytes([1.5, 2.0, -1.0]),
                crow_indices: proto::i64_bytes(crow),
                col_indices: proto::i64_bytes(col),
            })),
            dtype: proto::DType::Float32 as i32,
            shape: vec![3, 4],
        };
        let (v, k) = tensor_values(&csr(vec![0, 1, 1, 3], vec![1, 0, 3]), "w").unwrap();
        assert_eq!(k, 4);
        assert_eq!(
            v,
            TensorData::F32(vec![
                0.0, 1.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, -1.0
            ])
        );
        let e = tensor_values(&csr(vec![0, 1, 1, 3], vec![1, 0, 4]), "w").unwrap_err();
        assert!(
            e.to_string()
                .contains("w.sparse_csr.col_indices[2] = 4 is outside 0..4"),
            "{e}"
        );
        let e = tensor_values(&csr(vec![0, 2, 1, 3], vec![1, 0, 3]), "w").unwrap_err();
        assert!(e.to_string().contains("out of order"), "{e}");
    }

    #[test]
    fn sampling_params_refuse_what_they_cannot_represent() {
        let p = sampling_params(&json!({"max_tokens": 7, "seed": -1, "top_k": 5}), 100).unwrap();
        assert_eq!((p.max_tokens, p.seed, p.top_k), (7, Some(u64::MAX), 5));
        assert_eq!(sampling_params(&json!({}), 100).unwrap().max_tokens, 100);
        let full = sampling_params(&json!({}), 0).unwrap_err().to_string();
        assert!(
            full.contains("fills the model's whole context (--max-model-len)"),
            "{full}"
        );
        for (bad, field) in [
            (json!({"max_tokens": -5}), "sampling_params.max_tokens"),
            (json!({"max_tokens": 2.5}), "sampling_params.max_tokens"),
            (json!({"top_k": "ten"}), "sampling_params.top_k"),
            (json!({"seed": 1.5}), "sampling_params.seed"),
            (json!({"seed": "x"}), "sampling_params.seed"),
        ] {
            let e = sampling_params(&bad, 100).unwrap_err().to_string();
            assert!(e.starts_with(field), "{bad}: {e}");
        }
    }
}
