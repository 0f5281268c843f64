//! The one-turn case: `n` responses to one prompt that share an advantage baseline.
//!
//! [`OneTurn`] is the bare episode group (a prompt in, `n` samples and their texts out): it is
//! what `temper train` runs for every data set row (rewards from the `reward` section), and
//! [`SingleTurn`] is the same group scored by an environment task (`env.task`).
use crate::driver::{Answer, Ask, EnvGroup, Responder};
use crate::environment::{EnvRun, Environment, GroupContext, GroupOutcome};
use crate::question_sets::{Question, RewardOutput, Task};
use crate::train_data::episode_datums;
use crate::transcript::Transcript;
use anyhow::{bail, Result};
use serde_json::json;
use temper_rollout::{Sample, SamplingParams};

/// `params.n` samples of one prompt, seeded by `params.seed`.
pub struct OneTurn {
    prompt: Vec<i64>,
    params: SamplingParams,
    asked: bool,
    pub samples: Vec<Sample>,
    pub texts: Vec<String>,
}

impl OneTurn {
    pub fn new(prompt: Vec<i64>, params: SamplingParams) -> Self {
        OneTurn {
            prompt,
            params,
            asked: false,
            samples: vec![],
            texts: vec![],
        }
    }

    pub fn prompt(&self) -> &[i64] {
        &self.prompt
    }
}

impl EnvGroup for OneTurn {
    fn asks(&mut self) -> Result<Vec<Ask>> {
        if self.asked {
            return Ok(vec![]);
        }
        self.asked = true;
        Ok(vec![Ask {
            prompt_ids: self.prompt.clone(),
            params: self.params.clone(),
            responder: Responder::Policy,
        }])
    }

    fn answer(&mut self, answers: Vec<Answer>) -> Result<()> {
        let [a] = <[Answer; 1]>::try_from(answers)
            .map_err(|v| anyhow::anyhow!("one answer expected, got {}", v.len()))?;
        if a.samples.len() != self.params.n {
            bail!("{} samples for n = {}", a.samples.len(), self.params.n);
        }
        self.samples = a.samples;
        self.texts = a.texts;
        Ok(())
    }
}

/// A [`OneTurn`] group about a task's question, each response scored by the task.
pub struct SingleTurn<'a> {
    pub question: Question,
    task: &'a dyn Task,
    turn: OneTurn,
    pub episodes: Vec<Transcript>,
    pub scores: Vec<RewardOutput>,
}

impl<'a> SingleTurn<'a> {
    /// `params.n` responses to `prompt` (the question through the chat template), seeded by
    /// `params.seed`.
    pub fn new(
        question: Question,
        task: &'a dyn Task,
        prompt: Vec<i64>,
        params: SamplingParams,
    ) -> Self {
        SingleTurn {
            question,
            task,
            turn: OneTurn::new(prompt, params),
            episodes: vec![],
            scores: vec![],
        }
    }
}

impl EnvGroup for SingleTurn<'_> {
    fn asks(&mut self) -> Result<Vec<Ask>> {
        self.turn.asks()
    }

    fn answer(&mut self, answers: Vec<Answer>) -> Result<()> {
        self.turn.answer(answers)?;
        for (s, text) in self.turn.samples.iter().zip(&self.turn.texts) {
            let mut t = Transcript::new(self.turn.prompt.clone());
            self.scores
                .push(self.task.score_question(&self.question, text));
            t.act(s, text.clone())?;
            self.episodes.push(t);
        }
        Ok(())
    }
}

/// A task run one turn: each question's `n` answers are one group, scored by the task; the
/// trainer's advantage estimator sets their advantages.
pub struct OneTurnEnv {
    pub task: Box<dyn Task>,
}

impl Environment for OneTurnEnv {
    fn task(&self) -> &dyn Task {
        self.task.as_ref()
    }

    fn sets_advantages(&self) -> bool {
        false
    }

    fn needs_prompt(&self) -> bool {
        true
    }

    fn group<'a>(&'a self, q: Question, ctx: GroupContext<'a>) -> Result<Box<dyn EnvRun + 'a>> {
        let Some(prompt) = ctx.prompt else {
            bail!("question {}: a one-turn group needs its prompt ids", q.id);
        };
        Ok(Box::new(SingleTurn::new(
            q,
            self.task.as_ref(),
            prompt,
            ctx.params,
        )))
    }
}

impl EnvRun for SingleTurn<'_> {
    /// Datums with advantage 0 (the trainer's estimator sets them once every rank's are in), and
    /// per answer a `summary` record (the summary task) or a `baseline` record (the others).
    fn outcome(&self, step: usize) -> GroupOutcome {
        let rewards: Vec<f64> = self.scores.iter().map(|s| s.reward).collect();
        let zero = vec![0.0; rewards.len()];
        let summary = self.task.name() == "summary";
        let records = self
            .episodes
            .iter()
            .zip(&self.scores)
            .map(|(t, s)| {
                let q = &self.question;
                if summary {
                    let record = json!({
                        "step": step, "group": q.id, "article": q.metadata.get("article"),
                        "summary": s.extracted, "reward": s.reward, "metrics": s.metrics,
                    });
                    ("summary".to_string(), record)
                } else {
                    let record = json!({
                        "step": step, "group": q.id, "question": q.prompt, "answer": q.answer,
                        "response": t.turns[0].text, "extracted": s.extracted,
                        "parse_failed": s.parse_failed, "reward": s.reward, "metrics": s.metrics,
                    });
                    ("baseline".to_string(), record)
                }
            })
            .collect();
        GroupOutcome {
            datums: episode_datums(&self.episodes, &self.question.id, &rewards, &zero),
            parse_failures: self.scores.iter().filter(|s| s.parse_failed).count(),
            rewards,
            counts: Default::default(),
            records,
        }
    }
}
