//! How the trainer runs episode groups ([`temper_env`]): the sampler the episodes see (the
//! trainer's policy, in process or on the servers, and a debate's frozen judge model), and the
//! one-turn rollouts of `temper train` as [`OneTurn`] groups run by the same driver as debates.
use super::sampling::Rollouts;
use super::Producer;
use anyhow::Result;
use temper_env::single_turn::OneTurn;
use temper_env::{run_groups, EnvGroup, Responder, Responders};
use temper_model::{CausalLm, Tokenizer};
use temper_rollout::{Request, Sample, Sampler};

/// The sampler episodes see. It borrows the parts it samples with, not the trainer, so that an
/// environment run's next episodes can be played while the learner updates on another thread
/// (`rollout.async_steps`).
pub(crate) struct TrainerSampler<'a> {
    pub rollouts: &'a Rollouts,
    /// The weights the in-process engine samples the policy's requests with; None: the sampler
    /// thread's copy (`rollout.async_steps` in process). Unused when they go to the servers.
    pub policy: Option<&'a CausalLm>,
    /// A debate's judge model (`env.judge_model`), sampled in process.
    pub judge: Option<&'a CausalLm>,
    pub eos_ids: &'a [i64],
    pub tokenizer: &'a Tokenizer,
    pub seed: u64,
    /// The policy's requests go to the rollout servers when the run has them.
    pub on_servers: bool,
}

impl Responders for TrainerSampler<'_> {
    fn generate(&mut self, who: Responder, requests: &[Request]) -> Result<Vec<Sample>> {
        match who {
            Responder::Policy => self.rollouts.sample(
                self.policy,
                self.eos_ids,
                self.tokenizer,
                requests,
                self.seed,
                self.on_servers,
            ),
            Responder::Judge => {
                let judge = self
                    .judge
                    .ok_or_else(|| anyhow::anyhow!("a judge request without env.judge_model"))?;
                self.rollouts
                    .engine(judge, self.eos_ids, self.tokenizer, self.seed)
                    .sample(requests)
            }
        }
    }

    fn decode(&self, ids: &[i64]) -> Result<String> {
        self.tokenizer.decode(ids, true)
    }
}

impl Producer {
    /// Each request as a one-turn episode group, all sampled in one batched call (by `policy` in
    /// process): the samples (with `request_index` the request's position) and their texts.
    pub(super) fn one_turn_rollouts(
        &self,
        policy: &CausalLm,
        requests: Vec<Request>,
        seed: u64,
        on_servers: bool,
    ) -> Result<(Vec<Sample>, Vec<String>)> {
        let mut turns: Vec<OneTurn> = requests
            .into_iter()
            .map(|r| OneTurn::new(r.prompt_ids, r.params))
            .collect();
        {
            let mut groups: Vec<Box<dyn EnvGroup + '_>> = turns
                .iter_mut()
                .map(|g| Box::new(g) as Box<dyn EnvGroup>)
                .collect();
            let mut sampler = TrainerSampler {
                rollouts: &self.rollouts,
                policy: Some(policy),
                judge: None,
                eos_ids: &self.eos_ids,
                tokenizer: &self.tokenizer,
                seed,
                on_servers,
            };
            run_groups(&mut sampler, &mut groups, &mut |_, _| {})?;
        }
        let (mut samples, mut texts) = (vec![], vec![]);
        for (k, turn) in turns.into_iter().enumerate() {
            for mut s in turn.samples {
                s.request_index = k;
                samples.push(s);
            }
            texts.extend(turn.texts);
        }
        Ok((samples, texts))
    }
}
