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
//! continues the numbering.
use crate::rundir::write_json;
use anyhow::Result;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use temper_env::debate::DebateGroup;
use temper_env::single_turn::SingleTurn;
use temper_env::{Datum, Task, Transcript};

fn rounds(t: &Transcript) -> Value {
    (0..t.turns.len())
        .map(|k| {
            let (ids, lps) = t.turn_completion(k);
            json!({
                "prompt_tokens": t.turn_prompt(k),
                "completion_tokens": ids,
                "completion_logprobs": lps,
                "text": t.turns[k].text,
            })
        })
        .collect()
}

/// The step's episode records, `(kind, record)` with kind `debate`, `summary` or `baseline`, in
/// episode order (each rank makes its own; rank 0 writes all of them, [`write_records`]).
pub(crate) fn episode_records(
    step: usize,
    task: &dyn Task,
    singles: &[SingleTurn],
    debates: &[DebateGroup],
) -> Vec<(String, Value)> {
    let mut out = vec![];
    for g in debates {
        for d in &g.debates {
            let agents: Vec<Value> = (0..2)
                .map(|a| {
                    json!({
                        "side": if a == 0 { "A" } else { "B" },
                        "rounds": rounds(&d.agents[a]),
                        "r1_task_reward": d.r1_scores.get(a).map(|s| s.reward),
                        "r1_task_metrics": d.r1_scores.get(a).map(|s| &s.metrics),
                    })
                })
                .collect();
            let verdict = d.verdict.map(|v| v.name());
            out.push((
                "debate".to_string(),
                json!({
                    "step": step,
                    "group": g.question.id,
                    "question": g.question.prompt,
                    "answer": g.question.answer,
                    "verdict": verdict,
                    "judge": {
                        "reasoning": d.judge.text,
                        "prompt_tokens": d.judge.prompt_tokens,
                        "completion_tokens": d.judge.completion_tokens,
                    },
                    "agents": agents,
                }),
            ));
        }
    }
    let kind = if task.name() == "summary" {
        "summary"
    } else {
        "baseline"
    };
    for g in singles {
        for (t, s) in g.episodes.iter().zip(&g.scores) {
            let record = if kind == "summary" {
                json!({
                    "step": step,
                    "group": g.question.id,
                    "article": g.question.article,
                    "summary": s.extracted,
                    "reward": s.reward,
                    "metrics": s.metrics,
                })
            } else {
                json!({
                    "step": step,
                    "group": g.question.id,
                    "question": g.question.prompt,
                    "answer": g.question.answer,
                    "response": t.turns[0].text,
                    "extracted": s.extracted,
                    "parse_failed": s.parse_failed,
                    "reward": s.reward,
                    "metrics": s.metrics,
                })
            };
            out.push((kind.to_string(), record));
        }
    }
    out
}

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
    datums: &[Datum],
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
