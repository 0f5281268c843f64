//! The test-vector runner of `VECTORS.md`: every `*.json` file under a folder is one case
//! (`name`, `op`, `args`, `inputs`, `expected`, `rtol`, `atol`, optional `note`); the runner computes
//! the op with this crate (in f64) and compares every `expected` entry. An unknown op or key, an
//! unreadable file or an empty `expected` FAILS the case; nothing is skipped.

mod json;
mod ops;
mod run_ops;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{Map, Value};

use json::{compare, parse_array, Array};
use ops::{Args, Inputs, Want, OPS};

/// The outcome of one case file.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub file: PathBuf,
    /// The case's `name` (the file name when unreadable).
    pub name: String,
    pub passed: bool,
    /// Largest `|got - want|` over the compared entries (NaN-for-NaN matches excluded).
    pub max_abs_err: f64,
    /// Why it failed.
    pub reason: Option<String>,
}

impl fmt::Display for CaseResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self
            .file
            .file_name()
            .map(|s| s.to_string_lossy())
            .unwrap_or_default();
        if self.passed {
            write!(
                f,
                "PASS {}  max_abs_err={:.3e}  ({file})",
                self.name, self.max_abs_err
            )
        } else {
            write!(
                f,
                "FAIL {}  {}  ({file})",
                self.name,
                self.reason.as_deref().unwrap_or("")
            )
        }
    }
}

/// All cases of a folder, in file-name order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub cases: Vec<CaseResult>,
}

impl Report {
    pub fn passed(&self) -> usize {
        self.cases.iter().filter(|c| c.passed).count()
    }
    pub fn failed(&self) -> usize {
        self.cases.len() - self.passed()
    }
    /// True when there is at least one case and none failed.
    pub fn ok(&self) -> bool {
        !self.cases.is_empty() && self.failed() == 0
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.cases {
            writeln!(f, "{c}")?;
        }
        write!(f, "{} passed, {} failed", self.passed(), self.failed())
    }
}

fn json_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("reading vector folder {}", dir.display()))?;
    for e in entries {
        let path = e
            .with_context(|| format!("reading vector folder {}", dir.display()))?
            .path();
        if path.is_dir() {
            json_files(&path, out)?;
        } else if path.extension().is_some_and(|x| x == "json") {
            out.push(path);
        }
    }
    Ok(())
}

/// Run every `*.json` case under `dir` (recursively, sorted by path). Errors only when the folder
/// cannot be read; each bad case is a failed [`CaseResult`].
pub fn run_vectors(dir: &Path) -> Result<Report> {
    let mut files = Vec::new();
    json_files(dir, &mut files)?;
    files.sort();
    Ok(Report {
        cases: files.iter().map(|f| run_file(f)).collect(),
    })
}

/// Run one case file.
pub fn run_file(path: &Path) -> CaseResult {
    let fallback = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut result = CaseResult {
        file: path.to_path_buf(),
        name: fallback,
        passed: false,
        max_abs_err: 0.0,
        reason: None,
    };
    let value = match std::fs::read_to_string(path)
        .map_err(anyhow::Error::from)
        .and_then(|s| serde_json::from_str::<Value>(&s).map_err(anyhow::Error::from))
    {
        Ok(v) => v,
        Err(e) => {
            result.reason = Some(format!("cannot read case: {e}"));
            return result;
        }
    };
    if let Some(n) = value.get("name").and_then(Value::as_str) {
        result.name = n.to_string();
    }
    // tch reports some shape errors by panicking; a case must fail, not abort the run.
    let outcome = std::panic::catch_unwind(|| run_case(&value)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        Err(anyhow!(
            "computation failed: {}",
            msg.unwrap_or_default().lines().next().unwrap_or("")
        ))
    });
    match outcome {
        Ok(err) => {
            result.passed = true;
            result.max_abs_err = err;
        }
        Err(e) => result.reason = Some(format!("{e:#}")),
    }
    result
}

const TOP_KEYS: &[&str] = &[
    "name", "op", "args", "inputs", "expected", "rtol", "atol", "note",
];

fn object<'a>(v: &'a Value, key: &str) -> Result<&'a Map<String, Value>> {
    match v.get(key) {
        Some(Value::Object(m)) => Ok(m),
        Some(other) => bail!("`{key}` must be an object, got {other}"),
        None => bail!("missing key `{key}`"),
    }
}

fn number(v: &Value, key: &str) -> Result<f64> {
    match v.get(key) {
        Some(x) => x
            .as_f64()
            .filter(|t| *t >= 0.0)
            .ok_or_else(|| anyhow!("`{key}` must be a non-negative number, got {x}")),
        None => bail!("missing key `{key}`"),
    }
}

fn check_keys(section: &str, map: &Map<String, Value>, known: &[&str]) -> Result<()> {
    for k in map.keys() {
        if !known.contains(&k.as_str()) {
            bail!("unknown key {section}.{k}; known: {}", known.join(", "));
        }
    }
    Ok(())
}

fn parse_arrays(
    section: &str,
    map: &Map<String, Value>,
    allow_null: bool,
) -> Result<BTreeMap<String, Array>> {
    map.iter()
        .map(|(k, v)| {
            Ok((
                k.clone(),
                parse_array(v, allow_null, &format!("{section}.{k}"))?,
            ))
        })
        .collect()
}

/// Validate and run one case; Ok(max abs error) when every expected entry matches.
fn run_case(v: &Value) -> Result<f64> {
    let Some(top) = v.as_object() else {
        bail!("a case must be a JSON object")
    };
    for k in top.keys() {
        if !TOP_KEYS.contains(&k.as_str()) {
            bail!(
                "unknown top-level key `{k}`; known: {}",
                TOP_KEYS.join(", ")
            );
        }
    }
    match v.get("name") {
        Some(Value::String(_)) => {}
        _ => bail!("`name` must be a string"),
    }
    let op_name = v
        .get("op")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("`op` must be a string"))?;
    let Some(op) = OPS.iter().find(|o| o.name == op_name) else {
        let known: Vec<&str> = OPS.iter().map(|o| o.name).collect();
        bail!("unknown op {op_name:?}; known: {}", known.join(", "));
    };
    let (args, inputs, expected) = (
        object(v, "args")?,
        object(v, "inputs")?,
        object(v, "expected")?,
    );
    let (rtol, atol) = (number(v, "rtol")?, number(v, "atol")?);
    check_keys("args", args, op.args)?;
    check_keys("inputs", inputs, op.inputs)?;
    check_keys("expected", expected, op.expected)?;
    if expected.is_empty() {
        bail!("`expected` is empty: nothing to check");
    }
    let inputs = Inputs(parse_arrays("inputs", inputs, false)?);
    let expected = parse_arrays("expected", expected, true)?;
    let outputs = (op.run)(&Args(args), &inputs, &Want(&expected))
        .with_context(|| format!("op {op_name}"))?;
    let mut max_err: f64 = 0.0;
    let mut failures = Vec::new();
    for (key, want) in &expected {
        let Some((_, got)) = outputs.iter().find(|(k, _)| k == key) else {
            bail!("op {op_name} produced no `{key}`");
        };
        match compare(key, got, want, rtol, atol) {
            Ok(e) => max_err = max_err.max(e),
            Err(msg) => failures.push(msg),
        }
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(max_err)
}
