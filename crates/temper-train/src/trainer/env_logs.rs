//! The files an environment run writes to its run folder, atomically:
//! - `training_step_<k>.json` per step: `{"step", "loss", "num_trained_tokens", "datums"}`, each
//!   datum with `prompt_tokens`, `completion_tokens`, `completion_logprobs`,
//!   `completion_advantages`, `completion_mask` (1 = sampled, 0 = injected), `group`, `reward`;
//! - `debate_<k>.json` per debate: question, verdict, the judge's prompt/completion tokens and
//!   text, and per debater the three rounds' prompt/completion tokens, logprobs and text and the
//!   R1 task reward;
//! - `summary_<k>.json` per summary (`article`, `summary` as the reward saw it, `reward`,
//!   `metrics`) and `baseline_<k>.json` per answer of the other one-turn tasks.
//!
//! `k` counts from 0 over the run, in step order (`(step - 1) * per_step + j`), so a resumed run
//! continues the numbering. The records themselves are the environments' (`GroupOutcome`).
use crate::rundir::write_json;
use anyhow::Result;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use temper_env::Datum;

/// Writes the step's records (all ranks', in order) as `<kind>_<k>.json`, `k` counting per kind
/// from `(step - 1) * per_step`.
pub(crate) fn write_records(root: &Path, step: usize, records: &[(String, Value)]) -> Result<()> {
    let mut per_step: BTreeMap<&str, usize> = BTreeMap::new();
    for (kind, _) in records {
        *per_step.entry(kind).or_insert(0) += 1;
    }
    let mut next: BTreeMap<&str, usize> = per_step
        .iter()
        .map(|(&kind, &n)| (kind, (step - 1) * n))
        .collect();
    for (kind, record) in records {
        let k = next.get_mut(kind.as_str()).expect("counted above");
        write_json(&root.join(format!("{kind}_{k}.json")), record)?;
        *k += 1;
    }
    Ok(())
}

pub(crate) fn write_training_step(
    root: &Path,
    step: usize,
    loss: f64,
    trained_tokens: f64,
    datums: &[&Datum],
) -> Result<()> {
    write_json(
        &root.join(format!("training_step_{step}.json")),
        &json!({
            "step": step,
            "loss": loss,
            "num_trained_tokens": trained_tokens as u64,
            "datums": datums,
        }),
    )
}
