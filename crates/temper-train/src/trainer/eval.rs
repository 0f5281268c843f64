//! Evaluation on the held-out set: accuracy, mean@n and pass@k (unbiased estimator).
use super::{StepMetrics, Trainer};
use crate::eval_metrics::{ks_for, pass_at_k};
use anyhow::Result;
use serde_json::json;
use std::time::Instant;
use temper_base::seed::mix;

/// Salt of the evaluation sampling seeds: the same at every evaluation, so steps compare on the
/// same draws.
const EVAL_SEED_SALT: u64 = 0x6576_616c;

/// A response counts as correct when its reward is at least this (rewards are 0/1 for the
/// graders and tasks; partial credit below it is not a pass).
pub const CORRECT_THRESHOLD: f64 = 1.0;

impl Trainer {
    /// Evaluates the current policy; writes `eval/step_<step>.json` and returns `val/*` metrics.
    /// Data-parallel, every rank calls it: each samples a contiguous share of the prompts (seeded
    /// by global position, so the draws are those of one rank), the groups are gathered in order,
    /// and rank 0 writes the file.
    pub fn evaluate(&self, step: usize) -> Result<StepMetrics> {
        self.producer.freeze_sampler(&self.learner);
        let m = self.evaluate_frozen(step);
        self.producer.thaw_sampler(&self.learner)?;
        m
    }

    fn evaluate_frozen(&self, step: usize) -> Result<StepMetrics> {
        let mut m = StepMetrics::new();
        let Some(val) = self.producer.val() else {
            return Ok(m);
        };
        let t0 = Instant::now();
        let e = &self.eval_cfg;
        let count = e.max_prompts.map_or(val.len(), |k| k.min(val.len()));
        let (rank, world) = (self.dist.rank, self.dist.world);
        let (lo, hi) = (rank * count / world, (rank + 1) * count / world);
        let params = self.producer.eval_params(e);
        let mine = self.producer.rollout_groups(
            &self.learner,
            self.state.policy_version,
            val,
            lo..hi,
            &params,
            mix(self.trainer_cfg.seed, EVAL_SEED_SALT, 0),
        )?;
        let groups: Vec<_> = self
            .dist
            .all_gather_json(&mine)?
            .into_iter()
            .flatten()
            .collect();
        let n = e.n;
        let ks = ks_for(n);
        let (mut correct_total, mut reward_total, mut samples_total) = (0usize, 0.0, 0usize);
        let mut pass = vec![0.0; ks.len()];
        let mut reward_metrics: std::collections::BTreeMap<String, (f64, f64)> = Default::default();
        let mut records = Vec::new();
        for g in &groups {
            let c = g.scores.iter().filter(|s| **s >= CORRECT_THRESHOLD).count();
            correct_total += c;
            samples_total += g.scores.len();
            reward_total += g.scores.iter().sum::<f64>();
            for (i, &k) in ks.iter().enumerate() {
                pass[i] += pass_at_k(g.scores.len(), c, k.min(g.scores.len()));
            }
            for rm in &g.reward_metrics {
                for (k, v) in rm {
                    let e = reward_metrics.entry(k.clone()).or_insert((0.0, 0.0));
                    e.0 += v;
                    e.1 += 1.0;
                }
            }
            let ex = &val.examples[g.example];
            records.push(json!({
                "example": g.example,
                "prompt": ex.prompt.text(),
                "answer": ex.answer,
                "completions": g.texts,
                "scores": g.scores,
                "correct": c,
            }));
        }
        let prompts = groups.len().max(1) as f64;
        let accuracy = correct_total as f64 / samples_total.max(1) as f64;
        m.insert("val/accuracy".into(), accuracy);
        m.insert(
            format!("val/mean@{n}"),
            reward_total / samples_total.max(1) as f64,
        );
        let mut summary = serde_json::Map::new();
        for (i, k) in ks.iter().enumerate() {
            m.insert(format!("val/pass@{k}"), pass[i] / prompts);
            summary.insert(format!("pass@{k}"), json!(pass[i] / prompts));
        }
        for (k, (s, c)) in &reward_metrics {
            m.insert(format!("val/reward/{k}"), s / c);
        }
        let secs = t0.elapsed().as_secs_f64();
        m.insert("timing_s/eval".into(), secs);
        let doc = json!({
            "step": step,
            "dataset": val.name,
            "prompts": groups.len(),
            "n": n,
            "accuracy": accuracy,
            format!("mean@{n}"): reward_total / samples_total.max(1) as f64,
            "pass_at_k": summary,
            "reward_metrics": reward_metrics.iter().map(|(k, (s, c))| (k.clone(), json!(s / c))).collect::<serde_json::Map<_, _>>(),
            "sampling": params,
            "seconds": secs,
            "records": records,
        });
        if self.dist.is_root() {
            crate::rundir::write_json(&self.run.eval(step), &doc)?;
        }
        Ok(m)
    }
}
