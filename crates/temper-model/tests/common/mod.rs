//! Shared helpers for temper-model's integration tests: run the transformers reference scripts in
//! `tools/` (once per test binary) and build padded batches from unpadded rows.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;
use tch::{Kind, Tensor};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

pub fn python() -> PathBuf {
    repo_root().join(".venv/bin/python")
}

/// Run a script from `tools/` with the venv's Python; panics with its stderr on failure.
pub fn run_tool(script: &str, args: &[&str]) -> String {
    let out = Command::new(python())
        .arg(repo_root().join("tools").join(script))
        .args(args)
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap_or_else(|e| {
            panic!("running {script}: {e} (is .venv set up? scripts/setup-env.sh)")
        });
    assert!(
        out.status.success(),
        "{script} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// A fresh scratch folder under cargo's target tmp dir.
pub fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("temper-model-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Output of a tools/ script run with `args` into a folder, cached under target/tmp and keyed by a
/// hash of the script and its arguments, so the test binaries of one `cargo test` share one run.
/// The folder is written under a temporary name and renamed, so concurrent runs cannot see half of it.
pub fn cached_tool_output(script: &str, args: &[&str]) -> PathBuf {
    let src =
        std::fs::read(repo_root().join("tools").join(script)).expect("reading the tool script");
    let mut h: u64 = 0xcbf29ce484222325; // FNV-1a
    for b in src.iter().chain(args.join("\0").as_bytes()) {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100000001b3);
    }
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("temper-model-{script}-{h:016x}"));
    if !dir.is_dir() {
        let tmp = scratch(&format!("{script}-tmp"));
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--out", tmp.to_str().unwrap()]);
        run_tool(script, &all);
        if std::fs::rename(&tmp, &dir).is_err() {
            assert!(
                dir.is_dir(),
                "could not move {} to {}",
                tmp.display(),
                dir.display()
            );
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    dir
}

/// Tiny llama / qwen2 / qwen3 checkpoints + reference numbers from tools/model_reference.py.
pub fn reference_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| cached_tool_output("model_reference.py", &[]))
}

pub struct Reference {
    pub dir: PathBuf,
    pub rows: Vec<Vec<i64>>,
    pub coef: Vec<Vec<f64>>,
    pub temperature: f64,
    pub logp: Vec<Vec<f64>>,
    pub entropy: Vec<Vec<f64>>,
    pub logp_t: Vec<Vec<f64>>,
    pub entropy_t: Vec<Vec<f64>>,
    pub grad_names: Vec<String>,
    pub autocast_bf16_mean_err: f64,
    pub autocast_bf16_max_err: f64,
}

fn mat<T: serde::de::DeserializeOwned>(v: &Value, key: &str) -> T {
    serde_json::from_value(v[key].clone()).unwrap_or_else(|e| panic!("reference.json {key}: {e}"))
}

pub fn reference(model: &str) -> Reference {
    let dir = reference_dir().join(model);
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    Reference {
        rows: mat(&v, "rows"),
        coef: mat(&v, "coef"),
        temperature: v["temperature"].as_f64().unwrap(),
        logp: mat(&v, "logp"),
        entropy: mat(&v, "entropy"),
        logp_t: mat(&v, "logp_t"),
        entropy_t: mat(&v, "entropy_t"),
        grad_names: mat(&v, "grad_names"),
        autocast_bf16_mean_err: mat(&v, "autocast_bf16_mean_err"),
        autocast_bf16_max_err: mat(&v, "autocast_bf16_max_err"),
        dir,
    }
}

/// A padded batch: ids (B, T), mask (B, T), positions (B, T), targets (B, T) (next token, pad = 0),
/// and for each row the column of its first token.
pub struct Batch {
    pub ids: Tensor,
    pub mask: Tensor,
    pub pos: Tensor,
    pub targets: Tensor,
    pub start: Vec<i64>,
    pub lens: Vec<i64>,
}

/// Pad rows to a common length (plus `extra` pad columns), on the left or the right, with `pad_id`.
pub fn pad(rows: &[Vec<i64>], left: bool, extra: i64, pad_id: i64) -> Batch {
    let t = rows.iter().map(|r| r.len() as i64).max().unwrap() + extra;
    let b = rows.len() as i64;
    let mut ids = vec![pad_id; (b * t) as usize];
    let mut mask = vec![0i64; (b * t) as usize];
    let mut pos = vec![0i64; (b * t) as usize];
    let mut targets = vec![0i64; (b * t) as usize];
    let mut start = vec![];
    for (r, row) in rows.iter().enumerate() {
        let n = row.len() as i64;
        let s = if left { t - n } else { 0 };
        start.push(s);
        for (j, &id) in row.iter().enumerate() {
            let c = (r as i64 * t + s + j as i64) as usize;
            ids[c] = id;
            mask[c] = 1;
            pos[c] = j as i64;
            if j + 1 < row.len() {
                targets[c] = row[j + 1];
            }
        }
    }
    let mk = |v: Vec<i64>| Tensor::from_slice(&v).view([b, t]);
    Batch {
        ids: mk(ids),
        mask: mk(mask),
        pos: mk(pos),
        targets: mk(targets),
        start,
        lens: rows.iter().map(|r| r.len() as i64).collect(),
    }
}

impl Batch {
    /// Values of a (B, T) tensor at each row's positions 0..len-1 (the ones with a next token).
    pub fn per_row(&self, x: &Tensor) -> Vec<Vec<f64>> {
        let x = x.to_kind(Kind::Double);
        (0..self.lens.len())
            .map(|r| {
                let row = x.get(r as i64).narrow(0, self.start[r], self.lens[r] - 1);
                Vec::<f64>::try_from(&row).unwrap()
            })
            .collect()
    }

    /// A (B, T) f32 tensor holding `vals[r][j]` at row r's position j, zero elsewhere.
    pub fn scatter(&self, vals: &[Vec<f64>]) -> Tensor {
        let (b, t) = self.ids.size2().unwrap();
        let mut out = vec![0f32; (b * t) as usize];
        for (r, row) in vals.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                out[(r as i64 * t + self.start[r] + j as i64) as usize] = v as f32;
            }
        }
        Tensor::from_slice(&out).view([b, t])
    }
}

pub fn max_abs_diff(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f64::max)
}
