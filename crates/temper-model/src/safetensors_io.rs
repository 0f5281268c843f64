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
    let names = vec![tensors.iter().map(|(n, _)| n.clone()).collect()];
    write_safetensors_by_group(path, &names, dtype, &mut |_| {
        Ok(tensors.iter().map(|(_, t)| t.shallow_clone()).collect())
    })
}

/// Digits of the largest number a header holds (a shape's dimension, a byte offset).
const NUMBER_ROOM: usize = 20;
/// Dimensions a header entry has room for.
const MOST_DIMS: usize = 8;

/// Write tensors that are made group by group into one safetensors file at `path`: `groups`
/// holds each group's tensor names, and `tensors_of(g)` makes group g's tensors, in that order,
/// only when its turn comes, so one group need be in memory at a time (a sharded run's decoder
/// layer, gathered for the write and let go after). The header's room is reserved from the
/// names before any data and filled in last, padded with spaces as the format allows. Every
/// group is asked for even after a write fails (its making may be a collective the other ranks
/// take part in); the first error is returned.
pub fn write_safetensors_by_group(
    path: &Path,
    groups: &[Vec<String>],
    dtype: Option<Kind>,
    tensors_of: &mut dyn FnMut(usize) -> Result<Vec<Tensor>>,
) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    let io = |e: std::io::Error| anyhow::anyhow!("writing {}: {e}", path.display());
    // Each entry: `"name":{"dtype":"BOOL","shape":[d,...],"data_offsets":[a,b]},` at its longest.
    let per_entry = r#""":{"dtype":"BOOL","shape":[],"data_offsets":[,]},"#.len()
        + MOST_DIMS * (NUMBER_ROOM + 1)
        + 2 * NUMBER_ROOM;
    let names_room: usize = groups
        .iter()
        .flatten()
        .map(|n| serde_json::to_string(n).map_or(2 * n.len() + 2, |q| q.len()))
        .sum();
    let metadata = r#"{"__metadata__":{"format":"pt"},}"#.len();
    let room = (metadata + names_room + per_entry * groups.iter().map(Vec::len).sum::<usize>())
        .next_multiple_of(8);
    // Once something failed nothing more is written, but every group is still asked for.
    let mut failed: Option<anyhow::Error> = None;
    let mut w = match std::fs::File::create(path) {
        Ok(f) => Some(std::io::BufWriter::new(f)),
        Err(e) => {
            failed = Some(anyhow::anyhow!("creating {}: {e}", path.display()));
            None
        }
    };
    if let Some(w) = w.as_mut() {
        if let Err(e) = w
            .write_all(&(room as u64).to_le_bytes())
            .and_then(|()| w.write_all(&vec![b' '; room]))
        {
            failed = Some(io(e));
        }
    }
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0usize;
    let mut buf = Vec::new();
    for (g, names) in groups.iter().enumerate() {
        let tensors = match tensors_of(g) {
            Ok(t) => t,
            Err(e) => {
                failed.get_or_insert(e);
                continue;
            }
        };
        let Some(w) = w.as_mut().filter(|_| failed.is_none()) else {
            continue;
        };
        if tensors.len() != names.len() {
            failed = Some(anyhow::anyhow!(
                "writing {}: group {g} has {} tensors for {} names",
                path.display(),
                tensors.len(),
                names.len()
            ));
            continue;
        }
        for (name, t) in names.iter().zip(&tensors) {
            let kind = dtype.unwrap_or(t.kind());
            let written = dtype_name(kind)
                .and_then(|d| Ok((d, write_tensor(w, path, name, t, kind, &mut buf)?)));
            match written {
                Ok((dtype_name, bytes)) => {
                    header.insert(
                        name.clone(),
                        serde_json::json!({"dtype": dtype_name, "shape": t.size(), "data_offsets": [offset, offset + bytes]}),
                    );
                    offset += bytes;
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    let mut head = serde_json::to_vec(&header)?;
    if head.len() > room {
        bail!(
            "writing {}: the header needs {} bytes, {room} were reserved",
            path.display(),
            head.len()
        );
    }
    head.resize(room, b' ');
    let mut file = w
        .expect("the file is open when nothing failed")
        .into_inner()
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    file.seek(SeekFrom::Start(8)).map_err(io)?;
    file.write_all(&head).map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok(())
}

/// `t`'s elements as `kind` to `w` (the file at `path`), a slice at a time (through `buf`);
/// returns the bytes written.
fn write_tensor(
    w: &mut impl Write,
    path: &Path,
    name: &str,
    t: &Tensor,
    kind: Kind,
    buf: &mut Vec<u8>,
) -> Result<usize> {
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
        part.f_copy_data_u8(buf, len)
            .with_context(|| format!("reading tensor {name}"))?;
        w.write_all(buf)
            .with_context(|| format!("writing {}", path.display()))?;
        at += len;
    }
    Ok(n * kind.elt_size_in_bytes())
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
