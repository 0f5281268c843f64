//! A streaming safetensors writer (one tensor in memory at a time) that records
//! `{"format": "pt"}` metadata, which transformers expects, and a reader that hands over one
//! tensor at a time.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use tch::{Device, Kind, Tensor};

/// The dtypes temper reads and writes, with their safetensors names.
const DTYPES: [(Kind, &str); 10] = [
    (Kind::Float, "F32"),
    (Kind::BFloat16, "BF16"),
    (Kind::Half, "F16"),
    (Kind::Double, "F64"),
    (Kind::Int64, "I64"),
    (Kind::Int, "I32"),
    (Kind::Int16, "I16"),
    (Kind::Int8, "I8"),
    (Kind::Uint8, "U8"),
    (Kind::Bool, "BOOL"),
];

fn dtype_name(kind: Kind) -> Result<&'static str> {
    match DTYPES.iter().find(|(k, _)| *k == kind) {
        Some((_, name)) => Ok(name),
        None => bail!("cannot write dtype {kind:?} to safetensors"),
    }
}

fn kind_of(dtype: &str) -> Option<Kind> {
    DTYPES.iter().find(|(_, n)| *n == dtype).map(|(k, _)| *k)
}

/// Bytes converted and written per step: a tensor is never copied whole, so saving a model or
/// its optimizer state needs a few MB beyond the tensors themselves (a copy of the largest one,
/// an embedding of 113 MB on SmolLM2 and 545 MB on Qwen2.5-0.5B, was the save's peak).
const SLICE_BYTES: usize = 8 << 20;

/// Write `tensors` (any device) to `path` in safetensors format.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    write_safetensors_as(path, tensors, None)
}

/// Write `tensors` (any device) to `path` in safetensors format, each converted to `dtype` where
/// given, a slice at a time.
pub fn write_safetensors_as(
    path: &Path,
    tensors: &[(String, Tensor)],
    dtype: Option<Kind>,
) -> Result<()> {
    let saved_kind = |t: &Tensor| dtype.unwrap_or(t.kind());
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0usize;
    for (name, t) in tensors {
        let kind = saved_kind(t);
        let bytes = t.numel() * kind.elt_size_in_bytes();
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype_name(kind)?, "shape": t.size(), "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut head = serde_json::to_vec(&header)?;
    while head.len() % 8 != 0 {
        head.push(b' ');
    }
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = std::io::BufWriter::new(file);
    let io = |e: std::io::Error| anyhow::anyhow!("writing {}: {e}", path.display());
    w.write_all(&(head.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(&head).map_err(io)?;
    let mut buf = Vec::new();
    for (name, t) in tensors {
        let kind = saved_kind(t);
        let flat = t.detach().reshape([-1]);
        let n = flat.numel();
        let per = (SLICE_BYTES / kind.elt_size_in_bytes()).max(1);
        let mut at = 0;
        while at < n {
            let len = per.min(n - at);
            let part = flat
                .narrow(0, at as i64, len as i64)
                .to_device(Device::Cpu)
                .to_kind(kind)
                .contiguous();
            buf.resize(len * kind.elt_size_in_bytes(), 0);
            part.f_copy_data_u8(&mut buf, len)
                .with_context(|| format!("reading tensor {name}"))?;
            w.write_all(&buf).map_err(io)?;
            at += len;
        }
    }
    let file = w
        .into_inner()
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    file.sync_all().map_err(io)?;
    Ok(())
}

/// One tensor's entry in a safetensors header.
struct Entry {
    name: String,
    kind: Kind,
    shape: Vec<i64>,
    /// Byte range within the data section.
    start: u64,
    end: u64,
}

/// The largest header accepted (the format's own reference reader caps it at 100 MB).
const MAX_HEADER: u64 = 100 << 20;

/// Calls `f(name, tensor)` for every tensor of the safetensors file `path`, in name order, reading
/// each from the file when its turn comes: the file is never in memory whole (libtorch's reader
/// loads every tensor first, so loading a model took twice its size). A header that is not
/// safetensors, or a tensor whose bytes do not match its dtype and shape or lie outside the file,
/// is an error naming the file (and the tensor).
pub fn for_each_tensor(path: &Path, mut f: impl FnMut(String, Tensor) -> Result<()>) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let size = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    let mut r = std::io::BufReader::new(file);
    let bad = |what: String| anyhow::anyhow!("{}: not a safetensors file: {what}", path.display());
    let mut len = [0u8; 8];
    r.read_exact(&mut len)
        .map_err(|_| bad("shorter than its 8-byte header length".into()))?;
    let header_len = u64::from_le_bytes(len);
    if header_len > MAX_HEADER || 8 + header_len > size {
        return Err(bad(format!(
            "header length {header_len} for a file of {size} bytes"
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    r.read_exact(&mut header)
        .with_context(|| format!("reading {}", path.display()))?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)
        .map_err(|e| bad(format!("header is not a JSON object: {e}")))?;
    let data_start = 8 + header_len;
    let mut entries = vec![];
    for (name, v) in header {
        if name == "__metadata__" {
            continue;
        }
        let field = |k: &str| {
            v.get(k)
                .ok_or_else(|| bad(format!("tensor `{name}` has no `{k}`")))
        };
        let dtype = field("dtype")?.as_str().unwrap_or_default();
        let kind = kind_of(dtype)
            .ok_or_else(|| bad(format!("tensor `{name}` has unsupported dtype {dtype:?}")))?;
        let shape: Vec<i64> = serde_json::from_value(field("shape")?.clone())
            .map_err(|_| bad(format!("tensor `{name}`: shape is not a list of sizes")))?;
        let [start, end]: [u64; 2] = serde_json::from_value(field("data_offsets")?.clone())
            .map_err(|_| bad(format!("tensor `{name}`: data_offsets is not [start, end]")))?;
        let elements = shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?));
        let bytes = elements.and_then(|n| n.checked_mul(kind.elt_size_in_bytes() as u64));
        let in_file = data_start.checked_add(end).is_some_and(|e| e <= size);
        let matches = matches!((bytes, end.checked_sub(start)), (Some(a), Some(b)) if a == b);
        if !(matches && in_file) {
            return Err(bad(format!(
                "tensor `{name}` ({dtype} {shape:?}) has bytes {start}..{end} of a {}-byte data section",
                size - data_start
            )));
        }
        entries.push(Entry {
            name,
            kind,
            shape,
            start,
            end,
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let mut buf = Vec::new();
    for e in entries {
        buf.resize((e.end - e.start) as usize, 0);
        r.seek(SeekFrom::Start(data_start + e.start))
            .and_then(|_| r.read_exact(&mut buf))
            .with_context(|| format!("reading tensor `{}` of {}", e.name, path.display()))?;
        let t = Tensor::f_from_data_size(&buf, &e.shape, e.kind)
            .with_context(|| format!("tensor `{}` of {}", e.name, path.display()))?;
        f(e.name, t)?;
    }
    Ok(())
}
