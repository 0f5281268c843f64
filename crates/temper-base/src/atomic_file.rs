//! Atomic file writes (the one home for them: model conversion, run files, caches): write
//! `.NAME.tmp-PID-N` beside the target, flush, then rename over it, so a
//! reader never sees a half-written file and an interrupted conversion leaves no partial output.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique temporary path beside `target` (same directory, so the rename is atomic).
pub fn temp_path_for(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    target.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()))
}

/// A file being written; [`AtomicFile::commit`] renames it into place, dropping it uncommitted
/// deletes it.
pub struct AtomicFile {
    target: PathBuf,
    temp: PathBuf,
    writer: Option<BufWriter<File>>,
}

impl AtomicFile {
    pub fn create(target: &Path) -> Result<AtomicFile> {
        let temp = temp_path_for(target);
        let file =
            File::create(&temp).with_context(|| format!("cannot create {}", temp.display()))?;
        Ok(AtomicFile {
            target: target.to_path_buf(),
            temp,
            writer: Some(BufWriter::with_capacity(1 << 20, file)),
        })
    }

    pub fn writer(&mut self) -> &mut BufWriter<File> {
        self.writer.as_mut().expect("writer present until commit")
    }

    pub fn commit(mut self) -> Result<()> {
        let w = self.writer.take().expect("writer present until commit");
        let file = w
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("cannot write {}", self.temp.display()))?;
        file.sync_all()
            .with_context(|| format!("cannot flush {}", self.temp.display()))?;
        drop(file);
        fs::rename(&self.temp, &self.target).with_context(|| {
            format!(
                "cannot rename {} to {}",
                self.temp.display(),
                self.target.display()
            )
        })
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.writer.take().is_some() {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

/// Writes `target` atomically through a writer that takes a path (libtorch's safetensors
/// writer, an image encoder): `write` fills a temporary file beside it that keeps the target's
/// extension (encoders pick the format from it), which is flushed and renamed into place; on an
/// error it is removed and the old `target` stays.
pub fn write_atomic_with(target: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let mut temp = temp_path_for(target);
    if let Some(ext) = target.extension() {
        let mut name = temp.file_name().unwrap_or_default().to_os_string();
        name.push(".");
        name.push(ext);
        temp.set_file_name(name);
    }
    let written = write(&temp).and_then(|()| {
        File::open(&temp)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("cannot flush {}", temp.display()))?;
        fs::rename(&temp, target)
            .with_context(|| format!("cannot rename {} to {}", temp.display(), target.display()))
    });
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written
}

/// Writes `bytes` to `target` atomically.
pub fn write_atomic(target: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = AtomicFile::create(target)?;
    f.writer()
        .write_all(bytes)
        .with_context(|| format!("cannot write {}", target.display()))?;
    f.commit()
}

/// Writes pretty JSON (with a trailing newline) atomically.
pub fn write_json_atomic(target: &Path, value: &serde_json::Value) -> Result<()> {
    let mut s = serde_json::to_string_pretty(value).context("cannot serialise JSON")?;
    s.push('\n');
    write_atomic(target, s.as_bytes())
}
