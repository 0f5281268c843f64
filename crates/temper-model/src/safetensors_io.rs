//! A streaming safetensors writer (one tensor in memory at a time) that records
//! `{"format": "pt"}` metadata, which transformers expects.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use tch::{Device, Kind, Tensor};

fn dtype_name(kind: Kind) -> Result<&'static str> {
    Ok(match kind {
        Kind::Float => "F32",
        Kind::BFloat16 => "BF16",
        Kind::Half => "F16",
        Kind::Double => "F64",
        Kind::Int64 => "I64",
        Kind::Int => "I32",
        Kind::Int16 => "I16",
        Kind::Int8 => "I8",
        Kind::Uint8 => "U8",
        Kind::Bool => "BOOL",
        other => bail!("cannot write dtype {other:?} to safetensors"),
    })
}

/// Write `tensors` (any device) to `path` in safetensors format.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0usize;
    for (name, t) in tensors {
        let bytes = t.numel() * t.kind().elt_size_in_bytes();
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype_name(t.kind())?, "shape": t.size(), "data_offsets": [offset, offset + bytes]}),
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
    for (name, t) in tensors {
        let t = t.detach().to_device(Device::Cpu).contiguous();
        let mut buf = vec![0u8; t.numel() * t.kind().elt_size_in_bytes()];
        t.f_copy_data_u8(&mut buf, t.numel())
            .with_context(|| format!("reading tensor {name}"))?;
        w.write_all(&buf).map_err(io)?;
    }
    let file = w
        .into_inner()
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    file.sync_all().map_err(io)?;
    Ok(())
}
