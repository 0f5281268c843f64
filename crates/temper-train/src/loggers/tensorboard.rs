//! TensorBoard event files written directly: a TFRecord file of `Event` protobufs, each step one
//! `Summary` of scalars (`simple_value`), which TensorBoard and its `EventAccumulator` read.
//!
//! Record framing (TFRecord): little-endian u64 length, masked CRC-32C of the length bytes, the
//! bytes, masked CRC-32C of the bytes. The messages below carry only the fields written, with
//! the field numbers of tensorflow/core/util/event.proto and framework/summary.proto.
use anyhow::{Context, Result};
use prost::Message;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
}

const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// TFRecord's masked CRC: rotated and offset so that a CRC of data holding CRCs stays strong.
fn masked_crc(bytes: &[u8]) -> u32 {
    let c = CRC32C.checksum(bytes);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// One event file, appended to and flushed step by step (TensorBoard reads it while it grows).
pub struct EventWriter {
    path: PathBuf,
    file: std::fs::File,
}

fn wall_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl EventWriter {
    /// Creates `dir/events.out.tfevents.<seconds>.<host>.<pid>.temper` (a resumed run adds a
    /// file beside the old ones; TensorBoard reads a folder's files in name order).
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        let name = format!(
            "events.out.tfevents.{}.{host}.{}.temper",
            wall_time() as u64,
            std::process::id()
        );
        let path = dir.join(name);
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let mut w = EventWriter { path, file };
        w.write(&Event {
            wall_time: wall_time(),
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        })?;
        Ok(w)
    }

    /// One event holding every metric of `step` as a scalar (f32, as TensorBoard stores them).
    pub fn scalars(&mut self, step: usize, metrics: &BTreeMap<String, f64>) -> Result<()> {
        let value = metrics
            .iter()
            .map(|(tag, v)| SummaryValue {
                tag: tag.clone(),
                simple_value: Some(*v as f32),
            })
            .collect();
        self.write(&Event {
            wall_time: wall_time(),
            step: step as i64,
            file_version: None,
            summary: Some(Summary { value }),
        })
    }

    fn write(&mut self, event: &Event) -> Result<()> {
        let data = event.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        let mut record = Vec::with_capacity(data.len() + 16);
        record.extend_from_slice(&len);
        record.extend_from_slice(&masked_crc(&len).to_le_bytes());
        record.extend_from_slice(&data);
        record.extend_from_slice(&masked_crc(&data).to_le_bytes());
        // One write per record, so a crash leaves at most a truncated last record, which
        // TensorBoard's reader skips.
        self.file
            .write_all(&record)
            .and_then(|_| self.file.flush())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-32C's published check value (RFC 3720, "123456789" -> 0xE3069283).
    #[test]
    fn crc32c_is_castagnoli() {
        assert_eq!(CRC32C.checksum(b"123456789"), 0xE306_9283);
    }
}
