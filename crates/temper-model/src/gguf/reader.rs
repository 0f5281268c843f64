//! GGUF v2/v3 parser: header, metadata key/values (all types, nested arrays), tensor infos, and the
//! aligned tensor data section. The file is memory-mapped; tensor bytes are borrowed from the map.
//!
//! Layout (little-endian): magic `GGUF`, u32 version, u64 tensor count, u64 metadata count, the
//! metadata (`string key, u32 type, value`), the tensor infos (`string name, u32 n_dims, u64 dims[n],
//! u32 ggml type, u64 offset`), padding to `general.alignment` (default 32), then the data.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use memmap2::Mmap;

use super::types::GgmlType;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions (`GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Arrays nest (an array of arrays) only in theory; a deeper nesting means a corrupt file.
const MAX_ARRAY_DEPTH: usize = 8;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// Any integer type as `i128` (so every stored integer fits), `None` for other types.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Floats (and integers, which some writers use for float fields) as `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The GGUF type name, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "uint8",
            MetaValue::I8(_) => "int8",
            MetaValue::U16(_) => "uint16",
            MetaValue::I16(_) => "int16",
            MetaValue::U32(_) => "uint32",
            MetaValue::I32(_) => "int32",
            MetaValue::F32(_) => "float32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
            MetaValue::U64(_) => "uint64",
            MetaValue::I64(_) => "int64",
            MetaValue::F64(_) => "float64",
        }
    }
}

/// One tensor's description. `dims` is in ggml order (innermost first); `shape()` is row-major.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the tensor's bytes from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Row-major (PyTorch / safetensors) shape: the ggml dims reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Byte size of the data, or an error for an unsupported type or a row not a whole number of blocks.
    pub fn n_bytes(&self) -> Result<u64> {
        let (block, size) = self.ggml_type.block_geometry().with_context(|| {
            format!(
                "tensor '{}': unsupported ggml type {} (supported: {})",
                self.name,
                self.ggml_type,
                supported_list()
            )
        })?;
        let row = self.dims.first().copied().unwrap_or(1);
        if !row.is_multiple_of(block as u64) {
            bail!(
                "tensor '{}': row length {row} is not a multiple of the {} block size {block}",
                self.name,
                self.ggml_type
            );
        }
        Ok(self.n_elements() / block as u64 * size as u64)
    }
}

fn supported_list() -> String {
    GgmlType::SUPPORTED
        .iter()
        .filter_map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A parsed GGUF file, memory-mapped.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
    map: Mmap,
}

impl GgufFile {
    /// Opens and parses `path`; every error names the file and what was being read.
    pub fn open(path: &Path) -> Result<GgufFile> {
        Self::open_inner(path).with_context(|| format!("GGUF file {}", path.display()))
    }

    fn open_inner(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).context("cannot open")?;
        // SAFETY: the map is read-only; a file changed underneath us while mapped could give wrong
        // bytes but not memory unsafety beyond what every mmap-based reader accepts.
        let map = unsafe { Mmap::map(&file) }.context("cannot memory-map")?;
        let (version, metadata, tensors, header_end) = parse_header(&map)?;
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_int() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() => a as u64,
                _ => bail!("metadata 'general.alignment' = {v:?} is not a power of two"),
            },
        };
        let data_offset = header_end.div_ceil(alignment) * alignment;
        let g = GgufFile {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
            map,
        };
        g.check_tensor_bounds()?;
        Ok(g)
    }

    /// Every tensor must be aligned and lie inside the file (catches truncated downloads early).
    /// Unsupported types are checked later, when (and if) the tensor is read.
    fn check_tensor_bounds(&self) -> Result<()> {
        let data_len = (self.map.len() as u64).saturating_sub(self.data_offset);
        for t in &self.tensors {
            if !t.offset.is_multiple_of(self.alignment) {
                bail!(
                    "tensor '{}': offset {} is not a multiple of the alignment {}",
                    t.name,
                    t.offset,
                    self.alignment
                );
            }
            let Ok(n) = t.n_bytes() else { continue };
            let end = t.offset.checked_add(n);
            if end.is_none_or(|e| e > data_len) {
                bail!(
                    "tensor '{}': data truncated (needs bytes {}..{} of the data section, which has {data_len}; file size {})",
                    t.name,
                    t.offset,
                    t.offset.saturating_add(n),
                    self.map.len()
                );
            }
        }
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor (bounds were checked at open; the type is checked here).
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Result<&[u8]> {
        let n = t.n_bytes()?;
        let start = (self.data_offset + t.offset) as usize;
        Ok(&self.map[start..start + n as usize])
    }

    /// The tensor dequantized to f32, in row-major order.
    pub fn tensor_f32(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        let bytes = self.tensor_bytes(t)?;
        super::dequant::dequantize(t.ggml_type, bytes, t.n_elements() as usize)
            .with_context(|| format!("tensor '{}'", t.name))
    }
}

/// A bounds-checked little-endian cursor; errors say where and what was being read.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if self.buf.len() - self.pos < n {
            bail!(
                "truncated at byte {} reading {} (needs {n} bytes, file has {})",
                self.pos,
                what(),
                self.buf.len()
            );
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        Ok(self
            .take(N, what)?
            .try_into()
            .expect("take returned N bytes"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must fit in the rest of the file at `min_size` bytes per item, so that a corrupt
    /// count fails here instead of triggering a huge allocation.
    fn count(&mut self, min_size: usize, what: &dyn Fn() -> String) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let left = (self.buf.len() - self.pos) as u64;
        if n.checked_mul(min_size as u64).is_none_or(|b| b > left) {
            bail!(
                "corrupt count {n} at byte {at} for {} (only {left} bytes left in the file)",
                what()
            );
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let at = self.pos;
        let n = self.count(1, what)?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| anyhow::anyhow!("invalid UTF-8 at byte {at} in {}: {e}", what()))
    }

    fn value(&mut self, ty: u32, depth: usize, what: &dyn Fn() -> String) -> Result<MetaValue> {
        Ok(match ty {
            0 => MetaValue::U8(self.array::<1>(what)?[0]),
            1 => MetaValue::I8(self.array::<1>(what)?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            4 => MetaValue::U32(self.u32(what)?),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => bail!(
                    "invalid bool byte {b} at byte {} in {}",
                    self.pos - 1,
                    what()
                ),
            },
            8 => MetaValue::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    bail!("arrays nested deeper than {MAX_ARRAY_DEPTH} in {}", what());
                }
                let elem_ty = self.u32(what)?;
                let min = match elem_ty {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8..=12 => 8,
                    t => bail!(
                        "unknown array element type {t} at byte {} in {}",
                        self.pos - 4,
                        what()
                    ),
                };
                let n = self.count(min, what)?;
                let mut items = Vec::with_capacity(n);
                for i in 0..n {
                    let item_what = || format!("{}[{i}]", what());
                    items.push(self.value(elem_ty, depth + 1, &item_what)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(self.u64(what)?),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
            t => bail!(
                "unknown metadata value type {t} at byte {} in {}",
                self.pos - 4,
                what()
            ),
        })
    }
}

type Header = (u32, BTreeMap<String, MetaValue>, Vec<TensorInfo>, u64);

fn parse_header(buf: &[u8]) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0 };
    let magic = c.array::<4>(&|| "the magic".into())?;
    if &magic != MAGIC {
        bail!(
            "not a GGUF file (magic {:?}, expected \"GGUF\")",
            String::from_utf8_lossy(&magic)
        );
    }
    let version = c.u32(&|| "the version".into())?;
    match version {
        2 | 3 => {}
        1 => bail!("GGUF version 1 is not supported (only 2 and 3); re-convert the file with a newer llama.cpp"),
        v if v.swap_bytes() <= 3 => bail!("big-endian GGUF files are not supported"),
        v => bail!("unsupported GGUF version {v} (only 2 and 3)"),
    }
    // Minimum sizes: a metadata entry is at least key length (8) + type (4) + 1 byte; a tensor info
    // at least name length (8) + n_dims (4) + type (4) + offset (8).
    let n_tensors = c.count(24, &|| "the tensor count".into())?;
    let n_kv = c.count(13, &|| "the metadata count".into())?;
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let what = || format!("metadata '{key}'");
        let ty = c.u32(&what)?;
        let value = c.value(ty, 0, &what)?;
        if metadata.insert(key.clone(), value).is_some() {
            bail!("duplicate metadata key '{key}'");
        }
    }
    let mut tensors = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("tensor info #{i}"))?;
        let what = || format!("tensor info '{name}'");
        let n_dims = c.u32(&what)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            bail!("tensor '{name}': {n_dims} dimensions (ggml allows 1..={MAX_DIMS})");
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&what)?);
        }
        if dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .is_none_or(|n| n == 0)
        {
            bail!("tensor '{name}': invalid dimensions {dims:?}");
        }
        let ggml_type = GgmlType(c.u32(&what)?);
        let offset = c.u64(&what)?;
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
        });
    }
    let mut seen = std::collections::HashSet::new();
    for t in &tensors {
        if !seen.insert(t.name.as_str()) {
            bail!("duplicate tensor name '{}'", t.name);
        }
    }
    Ok((version, metadata, tensors, c.pos as u64))
}
