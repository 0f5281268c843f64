//! Reading records from JSONL and Parquet, and mapping fields to [`Example`]s.
use super::{Example, Prompt};
use crate::config::{AnswerExtract, DataConfig};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::path::Path;

/// Every record of a `.jsonl`/`.json` (one object per line, or a JSON array) or `.parquet` file,
/// with its 1-based line (JSONL) or row number, for error messages.
pub fn read_records(path: &Path) -> Result<Vec<(usize, Value)>> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    match ext {
        "parquet" => read_parquet(path),
        "jsonl" | "json" => read_json(path),
        _ => bail!(
            "{}: unknown data format (expected .jsonl, .json or .parquet)",
            path.display()
        ),
    }
}

fn read_json(path: &Path) -> Result<Vec<(usize, Value)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if text.trim_start().starts_with('[') {
        let v: Vec<Value> =
            serde_json::from_str(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        return Ok(v.into_iter().enumerate().map(|(i, v)| (i + 1, v)).collect());
    }
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .map_err(|e| anyhow!("{} line {}: not valid JSON: {e}", path.display(), i + 1))?;
        out.push((i + 1, v));
    }
    Ok(out)
}

fn read_parquet(path: &Path) -> Result<Vec<(usize, Value)>> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let reader = SerializedFileReader::new(file)
        .map_err(|e| anyhow!("{}: not a Parquet file: {e}", path.display()))?;
    let rows = reader
        .get_row_iter(None)
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, row) in rows.enumerate() {
        let row = row.map_err(|e| anyhow!("{} row {}: {e}", path.display(), i + 1))?;
        out.push((i + 1, row.to_json_value()));
    }
    Ok(out)
}

/// `a.b.c` inside a JSON value.
fn field<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    key.split('.').try_fold(v, |v, k| v.get(k))
}

/// Examples of one file, with `data.prompt_key` / `data.answer_key` / `data.answer_extract`.
pub fn load_file(path: &Path, cfg: &DataConfig) -> Result<Vec<Example>> {
    let records = read_records(path)?;
    if records.is_empty() {
        bail!("{}: no records (empty dataset)", path.display());
    }
    let unit = if path.extension().is_some_and(|e| e == "parquet") {
        "row"
    } else {
        "line"
    };
    records
        .into_iter()
        .map(|(n, rec)| {
            let at = || format!("{} {unit} {n}", path.display());
            let p = field(&rec, &cfg.prompt_key).ok_or_else(|| {
                anyhow!(
                    "{}: missing field `{}` (data.prompt_key)",
                    at(),
                    cfg.prompt_key
                )
            })?;
            let prompt =
                parse_prompt(p).with_context(|| format!("{}: field `{}`", at(), cfg.prompt_key))?;
            let a = field(&rec, &cfg.answer_key).ok_or_else(|| {
                anyhow!(
                    "{}: missing field `{}` (data.answer_key)",
                    at(),
                    cfg.answer_key
                )
            })?;
            let raw = match a {
                Value::String(s) => s.clone(),
                Value::Number(x) => x.to_string(),
                other => bail!(
                    "{}: field `{}` must be a string or number, got {other}",
                    at(),
                    cfg.answer_key
                ),
            };
            let answer = match cfg.answer_extract {
                AnswerExtract::Gsm8k => gsm8k_answer(&raw).ok_or_else(|| {
                    anyhow!("{}: field `{}` has no `####` answer", at(), cfg.answer_key)
                })?,
                AnswerExtract::None => raw,
            };
            Ok(Example {
                prompt,
                answer,
                metadata: rec,
            })
        })
        .collect()
}

fn parse_prompt(v: &Value) -> Result<Prompt> {
    match v {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(msgs) => {
            let mut out = Vec::new();
            for (i, m) in msgs.iter().enumerate() {
                let role = m.get("role").and_then(Value::as_str);
                let content = m.get("content").and_then(Value::as_str);
                match (role, content) {
                    (Some(r), Some(c)) => out.push((r.to_string(), c.to_string())),
                    _ => bail!("message {i} needs string `role` and `content`"),
                }
            }
            if out.is_empty() {
                bail!("empty message list");
            }
            Ok(Prompt::Messages(out))
        }
        other => bail!("must be a string or a list of {{role, content}} messages, got {other}"),
    }
}

/// GSM8K's ground truth: the text after `####`, without thousands commas.
pub(crate) fn gsm8k_answer(s: &str) -> Option<String> {
    let (_, a) = s.rsplit_once("####")?;
    Some(a.trim().replace(',', ""))
}
