//! GGUF -> Hugging Face folder: `model.safetensors` (f32), `config.json`, `generation_config.json`,
//! `tokenizer.json`, `tokenizer_config.json`. Everything is validated before anything is written;
//! each file is written atomically.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

use super::hf_config::{config_json, generation_config_json, Arch, Dims, SpecialIds};
use super::names::{hf_name, unpermute_rows};
use super::reader::{GgufFile, TensorInfo};
use super::tokenizer::tokenizer_files;
use temper_base::atomic_file::{write_json_atomic, AtomicFile};

/// What a conversion produced.
#[derive(Clone, Debug)]
pub struct ConvertReport {
    pub arch: Arch,
    pub n_tensors: usize,
    pub n_params: u64,
    /// Things the user should know (e.g. an unknown pre-tokenizer name); not errors.
    pub warnings: Vec<String>,
}

/// Converts the GGUF file at `gguf` into an HF folder at `out_dir` (created if needed; files of
/// the same names are replaced). Errors name the file and, where relevant, the tensor or key.
pub fn convert_gguf(gguf: &Path, out_dir: &Path) -> Result<ConvertReport> {
    let g = GgufFile::open(gguf)?;
    convert_file(&g, out_dir).with_context(|| format!("GGUF file {}", gguf.display()))
}

/// One output tensor: its HF name and shape, where it comes from, and how many heads to un-permute by.
struct Planned<'a> {
    hf: String,
    shape: Vec<usize>,
    source: &'a TensorInfo,
    unpermute_heads: Option<usize>,
}

fn plan<'a>(g: &'a GgufFile, d: &Dims) -> Result<Vec<Planned<'a>>> {
    let mut by_name: BTreeMap<String, Planned> = BTreeMap::new();
    for t in &g.tensors {
        let hf = hf_name(&t.name)?;
        let shape = t.shape();
        let Some(expected) = d.expected_shape(&hf) else {
            bail!(
                "tensor '{}' ({hf}) does not belong in a {:?} model with {} layers",
                t.name,
                d.arch,
                d.n_layer
            );
        };
        if shape != expected {
            bail!(
                "tensor '{}' has shape {shape:?}, expected {expected:?}",
                t.name
            );
        }
        t.n_bytes()?; // unsupported types fail here, before anything is written
                      // llama.cpp permutes Q/K only for the llama architecture (`LlamaModel.modify_tensors`).
        let unpermute_heads = match (d.arch, t.name.rsplit('.').nth(1)) {
            (Arch::Llama, Some("attn_q")) => Some(d.n_head),
            (Arch::Llama, Some("attn_k")) => Some(d.n_kv_head),
            _ => None,
        };
        by_name.insert(
            hf.clone(),
            Planned {
                hf,
                shape,
                source: t,
                unpermute_heads,
            },
        );
    }
    let missing: Vec<String> = d
        .required_names()
        .into_iter()
        .filter(|n| !by_name.contains_key(n))
        .collect();
    if let Some(first) = missing.first() {
        bail!(
            "{} required tensor(s) missing, first: {first}",
            missing.len()
        );
    }
    Ok(by_name.into_values().collect())
}

fn convert_file(g: &GgufFile, out_dir: &Path) -> Result<ConvertReport> {
    let dims = Dims::read(g)?;
    let ids = SpecialIds::read(g, dims.vocab)?;
    let tok = tokenizer_files(g, &ids, dims.context)?;
    let n_tokens = tok.tokenizer_json["model"]["vocab"]
        .as_object()
        .map_or(0, |v| v.len());
    if n_tokens > dims.vocab {
        bail!(
            "the tokenizer has {n_tokens} tokens but the embedding only {} rows",
            dims.vocab
        );
    }
    let tensors = plan(g, &dims)?;
    check_out_dir(out_dir)?;

    std::fs::create_dir_all(out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    let n_params = write_safetensors(g, &tensors, &out_dir.join("model.safetensors"))?;
    write_json_atomic(&out_dir.join("config.json"), &config_json(&dims, &ids))?;
    write_json_atomic(
        &out_dir.join("generation_config.json"),
        &generation_config_json(&ids),
    )?;
    write_json_atomic(&out_dir.join("tokenizer.json"), &tok.tokenizer_json)?;
    write_json_atomic(
        &out_dir.join("tokenizer_config.json"),
        &tok.tokenizer_config_json,
    )?;
    Ok(ConvertReport {
        arch: dims.arch,
        n_tensors: tensors.len(),
        n_params,
        warnings: tok.warnings,
    })
}

/// Refuses a folder holding another checkpoint's weights (shards or an index), which loaders would
/// pick up instead of, or together with, the converted `model.safetensors`.
fn check_out_dir(out_dir: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(out_dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let weights = name.ends_with(".safetensors")
            || name.ends_with(".bin")
            || name.ends_with(".index.json");
        if weights && name != "model.safetensors" {
            bail!(
                "output folder {} already holds other weights ({name}); use an empty folder",
                out_dir.display()
            );
        }
    }
    Ok(())
}

/// Streams the tensors (dequantized, un-permuted) into an f32 safetensors file; returns the
/// parameter count. Format: u64 LE header length, JSON header padded with spaces to 8 bytes, data.
fn write_safetensors(g: &GgufFile, tensors: &[Planned], path: &Path) -> Result<u64> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0u64;
    for t in tensors {
        let bytes = t.shape.iter().product::<usize>() as u64 * 4;
        header.insert(
            t.hf.clone(),
            json!({"dtype": "F32", "shape": t.shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut header = serde_json::to_vec(&Value::Object(header))?;
    header.resize(header.len().div_ceil(8) * 8, b' ');

    let mut file = AtomicFile::create(path)?;
    let w = file.writer();
    let io = |e: std::io::Error| {
        anyhow::Error::new(e).context(format!("cannot write {}", path.display()))
    };
    w.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(&header).map_err(io)?;
    let mut buf = Vec::new();
    let mut n_params = 0u64;
    for t in tensors {
        let src = t.source;
        let mut data = g.tensor_f32(src)?;
        if let Some(bad) = data.iter().position(|x| !x.is_finite()) {
            bail!(
                "tensor '{}': dequantized value #{bad} is {} (corrupt data?)",
                src.name,
                data[bad]
            );
        }
        if let Some(heads) = t.unpermute_heads {
            let rows = t.shape[0];
            let cols = t.shape.get(1).copied().unwrap_or(1);
            unpermute_rows(&mut data, rows, cols, heads)
                .with_context(|| format!("tensor '{}'", src.name))?;
        }
        buf.clear();
        buf.reserve(data.len() * 4);
        for x in &data {
            buf.extend_from_slice(&x.to_le_bytes());
        }
        w.write_all(&buf).map_err(io)?;
        n_params += data.len() as u64;
    }
    file.commit()?;
    Ok(n_params)
}
