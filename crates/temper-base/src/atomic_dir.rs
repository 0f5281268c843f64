//! Writing a folder (a model, a checkpoint) so that no reader ever sees it half-written and its
//! previous version survives a crash at any point: the new folder is filled under a temporary
//! name beside the target; the old one is moved aside (`.NAME.old`), the new one renamed into
//! place, and only then is the old one deleted. A process killed between the two renames leaves
//! the old folder aside, and [`restore_interrupted`] (called by the writer and by readers that
//! look a folder up) puts it back.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Where the previous version of `dir` waits while the new one is renamed into place.
fn aside(dir: &Path) -> PathBuf {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    dir.with_file_name(format!(".{name}.old"))
}

/// Undoes a replacement of `dir` that was interrupted between its two renames (the old folder
/// is put back), or deletes the old folder a finished one left behind.
pub fn restore_interrupted(dir: &Path) -> Result<()> {
    let old = aside(dir);
    if !old.exists() {
        return Ok(());
    }
    if dir.exists() {
        std::fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))
    } else {
        std::fs::rename(&old, dir).with_context(|| {
            format!(
                "restoring {} from an interrupted save ({})",
                dir.display(),
                old.display()
            )
        })
    }
}

/// Creates or replaces the folder `dir` with what `fill` writes into the (empty, existing)
/// folder it is given.
pub fn write_dir_atomically(dir: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let name = dir
        .file_name()
        .with_context(|| format!("{}: not a folder name", dir.display()))?
        .to_string_lossy()
        .into_owned();
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    restore_interrupted(dir)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let tmp = parent.join(format!(".{name}.tmp-{}-{stamp}", std::process::id()));
    std::fs::create_dir(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    if let Err(e) = fill(&tmp) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let old = aside(dir);
    let replacing = dir.exists();
    if replacing {
        std::fs::rename(dir, &old)
            .with_context(|| format!("moving the old {} aside", dir.display()))?;
    }
    if let Err(e) = std::fs::rename(&tmp, dir) {
        if replacing {
            let _ = std::fs::rename(&old, dir);
        }
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e).with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()));
    }
    if replacing {
        std::fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("temper-atomic-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn write(dir: &Path, text: &str) -> Result<()> {
        write_dir_atomically(dir, |tmp| Ok(std::fs::write(tmp.join("f"), text)?))
    }

    #[test]
    fn replaces_keeps_the_old_on_failure_and_recovers_an_interrupted_swap() {
        let root = scratch("dir");
        let dir = root.join("ckpt");
        write(&dir, "one").unwrap();
        write(&dir, "two").unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("f")).unwrap(), "two");
        // A fill that fails leaves the old folder and no temporary one.
        let e = write_dir_atomically(&dir, |_| anyhow::bail!("disk full")).unwrap_err();
        assert!(e.to_string().contains("disk full"));
        assert_eq!(std::fs::read_to_string(dir.join("f")).unwrap(), "two");
        let names: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["ckpt".to_string()]);
        // Killed between the renames: the old folder is aside and the target is missing.
        std::fs::rename(&dir, aside(&dir)).unwrap();
        restore_interrupted(&dir).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("f")).unwrap(), "two");
        // Killed after the second rename: the old folder is deleted, the new one stays.
        std::fs::create_dir(aside(&dir)).unwrap();
        write(&dir, "three").unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("f")).unwrap(), "three");
        assert!(!aside(&dir).exists());
    }
}
