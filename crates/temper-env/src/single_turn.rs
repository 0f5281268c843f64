//! The one-turn case: the `n` responses to one question, scored by its task; they share an
//! advantage baseline.
use crate::driver::{Answer, Ask, EnvGroup, Responder};
use crate::tasks::{Question, Scored, Task};
use crate::transcript::Transcript;
use anyhow::{bail, Result};
use temper_rollout::SamplingParams;

pub struct SingleTurn<'a> {
    pub question: Question,
    task: &'a dyn Task,
    prompt: Vec<i64>,
    params: SamplingParams,
    asked: bool,
    pub episodes: Vec<Transcript>,
    pub scores: Vec<Scored>,
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
            prompt,
            params,
            asked: false,
            episodes: vec![],
            scores: vec![],
        }
    }
}

impl EnvGroup for SingleTurn<'_> {
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
        for (s, text) in a.samples.iter().zip(a.texts) {
            let mut t = Transcript::new(self.prompt.clone());
            self.scores.push(self.task.score(&self.question, &text));
            t.act(s, text)?;
            self.episodes.push(t);
        }
        Ok(())
    }
}
