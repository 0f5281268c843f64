//! Debate as an environment (`env.name = "debate"`): each question's `n` rollouts are `n / 2`
//! debates of two debaters and a judge ([`DebateGroup`]), trained as `env.debate_train` says.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use temper_model::CausalLm;
use temper_rollout::SamplingParams;

use super::judge::JudgeKind;
use super::{DebateConfig, DebateGroup, DebateTemplates};
use crate::chat::ChatTurns;
use crate::driver::{Answer, Ask, EnvGroup};
use crate::environment::{EnvRun, EnvSettings, Environment, GroupContext, GroupOutcome};
use crate::question_sets::{Question, Task};
use crate::train_data::{debate_datums, DebateTrain};

pub struct DebateEnv {
    task: Box<dyn Task>,
    cfg: DebateConfig,
    turns: ChatTurns,
    train: DebateTrain,
    /// `env.judge = "model"`: the frozen judge.
    judge_model: Option<CausalLm>,
}

/// A string option, `default` when absent or empty.
fn text(o: &Value, key: &str, default: &str) -> Result<String> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(default.to_string()),
        Some(Value::String(s)) if s.is_empty() => Ok(default.to_string()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => bail!("env.{key}: expected a string, got {other}"),
    }
}

fn number(o: &Value, key: &str, default: f64) -> Result<f64> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_f64()
            .with_context(|| format!("env.{key}: expected a number, got {v}")),
    }
}

/// The debate of `settings` (`env.judge`, `judge_model`, `judge_temperature`,
/// `judge_max_tokens`, `debate_train`, `grpo_std`, `r23_constant`, the round instructions).
pub fn build(settings: EnvSettings<'_>) -> Result<Box<dyn Environment>> {
    let o = settings.options;
    let tokenizer = settings.tokenizer;
    let turns = ChatTurns::from_template(tokenizer).context("env.name = \"debate\"")?;
    let judge = JudgeKind::parse(&text(o, "judge", "mock")?)?;
    let judge_model = match (&judge, o.get("judge_model").and_then(Value::as_str)) {
        (JudgeKind::Model, Some(path)) => {
            let dir = temper_model::resolve::resolve_model(path)
                .with_context(|| format!("env.judge_model = {path:?}"))?;
            let m = CausalLm::load(&dir, settings.device, settings.compute)
                .with_context(|| format!("loading the judge {}", dir.display()))?;
            if (m.config().vocab_size as usize) < tokenizer.vocab_size() {
                bail!(
                    "env.judge_model {}: its vocabulary ({}) does not cover the policy's tokenizer ({})",
                    dir.display(),
                    m.config().vocab_size,
                    tokenizer.vocab_size()
                );
            }
            Some(m)
        }
        _ => None,
    };
    let d = DebateTemplates::default();
    let templates = DebateTemplates {
        r1: text(o, "r1_instruction", &d.r1)?,
        r2_before: text(o, "r2_before", &d.r2_before)?,
        r2_after: text(o, "r2_after", &d.r2_after)?,
        r3_before: text(o, "r3_before", &d.r3_before)?,
        r3_after: text(o, "r3_after", &d.r3_after)?,
    };
    let judge_params = SamplingParams {
        n: 1,
        temperature: number(o, "judge_temperature", 0.3)?,
        max_tokens: number(o, "judge_max_tokens", 256.0)? as usize,
        ..SamplingParams::default()
    };
    let train = DebateTrain::parse(
        &text(o, "debate_train", "rejection")?,
        o.get("grpo_std").and_then(Value::as_bool).unwrap_or(false),
        number(o, "r23_constant", 1.0)?,
    )?;
    Ok(Box::new(DebateEnv {
        task: settings.task,
        cfg: DebateConfig {
            judge,
            params: SamplingParams {
                n: 1,
                ..settings.params
            },
            judge_params,
            templates,
            eos_ids: settings.eos_ids,
        },
        turns,
        train,
        judge_model,
    }))
}

/// A question's debates and how they train.
struct DebateRun<'a> {
    group: DebateGroup<'a>,
    train: DebateTrain,
}

impl EnvGroup for DebateRun<'_> {
    fn asks(&mut self) -> Result<Vec<Ask>> {
        self.group.asks()
    }
    fn answer(&mut self, answers: Vec<Answer>) -> Result<()> {
        self.group.answer(answers)
    }
}

impl EnvRun for DebateRun<'_> {
    /// The training mode's datums, the debaters' R1 task rewards, `env/debates` and
    /// `env/invalid_verdicts`, and a `debate` record per debate.
    fn outcome(&self, step: usize) -> GroupOutcome {
        let g = &self.group;
        let mut out = GroupOutcome {
            datums: debate_datums(g, self.train),
            ..GroupOutcome::default()
        };
        out.counts
            .insert("env/debates".into(), g.debates.len() as f64);
        out.counts
            .insert("env/invalid_verdicts".into(), g.invalid() as f64);
        for d in &g.debates {
            out.rewards.extend(d.r1_scores.iter().map(|s| s.reward));
            out.parse_failures += d.r1_scores.iter().filter(|s| s.parse_failed).count();
            let agents: Vec<Value> = (0..2)
                .map(|a| {
                    json!({
                        "side": if a == 0 { "A" } else { "B" },
                        "rounds": d.agents[a].rounds_json(),
                        "r1_task_reward": d.r1_scores.get(a).map(|s| s.reward),
                        "r1_task_metrics": d.r1_scores.get(a).map(|s| &s.metrics),
                    })
                })
                .collect();
            out.records.push((
                "debate".to_string(),
                json!({
                    "step": step,
                    "group": g.question.id,
                    "question": g.question.prompt,
                    "answer": g.question.answer,
                    "verdict": d.verdict.map(|v| v.name()),
                    "judge": {
                        "reasoning": d.judge.text,
                        "prompt_tokens": d.judge.prompt_tokens,
                        "completion_tokens": d.judge.completion_tokens,
                    },
                    "agents": agents,
                }),
            ));
        }
        out
    }
}

impl Environment for DebateEnv {
    fn task(&self) -> &dyn Task {
        self.task.as_ref()
    }

    fn sets_advantages(&self) -> bool {
        true
    }

    fn needs_prompt(&self) -> bool {
        false
    }

    /// `n / 2` debates, debate `k` seeded from the group's seed.
    fn group<'a>(&'a self, q: Question, ctx: GroupContext<'a>) -> Result<Box<dyn EnvRun + 'a>> {
        let seeds: Vec<u64> = (0..ctx.n / 2)
            .map(|k| temper_base::seed::mix(ctx.seed, k as u64, 1))
            .collect();
        let group = DebateGroup::new(
            q,
            self.task.as_ref(),
            ctx.codec,
            &self.turns,
            &self.cfg,
            &seeds,
        )?;
        Ok(Box::new(DebateRun {
            group,
            train: self.train,
        }))
    }

    fn judge_model(&self) -> Option<&CausalLm> {
        self.judge_model.as_ref()
    }

    fn round_line(&self, round: usize, asks: usize) -> Option<String> {
        Some(match round {
            1..=3 => format!("[debate] Round {round}/3: {asks} turns"),
            _ => format!("[debate] Judge: {asks} verdicts"),
        })
    }
}
