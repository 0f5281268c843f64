//! Phase 1 of a prompt run's step: draw the step's prompt groups (sampled and scored), with
//! DAPO's dynamic sampling (`algorithm.filter_groups`) drawing more batches until enough groups
//! have a reward spread; each data batch's groups come from the batch sampled ahead (by the
//! sampler thread or the servers, sent by [`Producer::generate_ahead`] through `Rollouts`) or are
//! sampled now (`rollout.rs`) and scored (`score.rs`).
use super::rollout::Group;
use super::{Producer, TRAIN_SEED_SALT};
use crate::checkpoint::TrainerState;
use crate::trainer::stats::StepMetrics;
use crate::trainer::Learner;
use anyhow::Result;
use temper_base::seed::mix;
use temper_rollout::{Request, SamplingParams};

/// The groups a step trains on, and what drawing them took.
pub(crate) struct Drawn {
    /// Whole-batch groups in batch order (data-parallel: every rank's, gathered).
    pub groups: Vec<Group>,
    /// Groups sampled (kept or filtered out).
    drawn: usize,
    /// Groups whose samples all have the same score (no GRPO signal).
    zero_groups: usize,
    /// Batches drawn (more than 1 only with `algorithm.filter_groups`).
    rounds: usize,
    /// Samples the reward could not score.
    reward_errors: usize,
}

impl Drawn {
    /// `batch/*`, `reward/errors` and, against the trainer's `policy_version`, `rollout/policy_*`.
    pub fn metrics(&self, policy_version: u64) -> StepMetrics {
        let mut m = StepMetrics::new();
        if let Some(oldest) = self.groups.iter().map(|g| g.policy_version).min() {
            let lags: Vec<f64> = self
                .groups
                .iter()
                .map(|g| policy_version.saturating_sub(g.policy_version) as f64)
                .collect();
            m.insert("rollout/policy_version".into(), oldest as f64);
            m.insert(
                "rollout/policy_lag_mean".into(),
                lags.iter().sum::<f64>() / lags.len() as f64,
            );
            m.insert(
                "rollout/policy_lag_max".into(),
                lags.iter().copied().fold(0.0, f64::max),
            );
        }
        m.insert("batch/zero_adv_groups".into(), self.zero_groups as f64);
        m.insert(
            "batch/zero_adv_groups_frac".into(),
            self.zero_groups as f64 / self.drawn.max(1) as f64,
        );
        m.insert("batch/groups".into(), self.groups.len() as f64);
        m.insert("batch/gen_rounds".into(), self.rounds as f64);
        m.insert("reward/errors".into(), self.reward_errors as f64);
        m
    }
}

impl Producer {
    /// Draws batches of `data.train_batch_size` prompts (each rank samples its share, then every
    /// rank gets every group) until the step has its groups: one batch, or with
    /// `algorithm.filter_groups` as many as it takes (up to `max_num_gen_batches`, default 100)
    /// to collect that many groups with a reward spread.
    pub(super) fn draw_groups(
        &mut self,
        step: usize,
        learner: &Learner,
        state: &mut TrainerState,
        params: &SamplingParams,
    ) -> Result<Drawn> {
        let drawn = self.draw_rounds(step, learner, state, params);
        // Every round sampled in process used the same sampling copies, built once.
        self.thaw_sampler(learner)?;
        drawn
    }

    fn draw_rounds(
        &mut self,
        step: usize,
        learner: &Learner,
        state: &mut TrainerState,
        params: &SamplingParams,
    ) -> Result<Drawn> {
        let want = self.questions.batch_size();
        let filter_groups = self.questions.filter_groups().clone();
        let filter = filter_groups.enable;
        let max_rounds = match filter_groups.max_num_gen_batches {
            0 => 100,
            k => k,
        };
        let mut d = Drawn {
            groups: Vec::new(),
            drawn: 0,
            zero_groups: 0,
            rounds: 0,
            reward_errors: 0,
        };
        loop {
            let batch_index = state.batches_drawn;
            state.batches_drawn += 1;
            d.rounds += 1;
            // A batch sampled now, in process, needs the sampling copies (built at the first
            // such round; the same choice on every rank: the batches sent ahead are the same).
            if !self.rollouts.is_remote() && !self.rollouts.sent_ahead(batch_index) {
                self.freeze_sampler(learner);
            }
            // Data-parallel: each rank samples its share of the prompts, then every rank gets
            // every group (in batch order), so the rest of the step sees the whole batch.
            let local =
                self.train_batch_groups(batch_index, learner, state.policy_version, params)?;
            for g in self.dist.all_gather_json(&local)?.into_iter().flatten() {
                d.drawn += 1;
                d.reward_errors += g.reward_errors;
                if g.zero_variance() {
                    d.zero_groups += 1;
                }
                if filter && g.no_spread_in(filter_groups.metric) {
                    continue;
                }
                d.groups.push(g);
            }
            if !filter || d.groups.len() >= want {
                break;
            }
            if d.rounds >= max_rounds {
                eprintln!(
                    "warning: step {step}: only {} of {want} groups with a reward spread after {} generation \
                     rounds (algorithm.filter_groups.max_num_gen_batches); training on those",
                    d.groups.len(),
                    d.rounds
                );
                break;
            }
        }
        d.groups.truncate(want);
        // DAPO may end with fewer groups than asked for; data-parallel, keep a multiple of the
        // world size so that every rank gets the same share of each mini-batch.
        let world = self.dist.world;
        d.groups.truncate(d.groups.len() - d.groups.len() % world);
        Ok(d)
    }

    /// Sends the batches of the next `rollout.async_steps` steps not yet sent to be sampled
    /// ahead, by the sampler thread or the servers (nothing without overlap). `next_batch` is
    /// the next data batch to be drawn.
    pub(super) fn generate_ahead(
        &mut self,
        next_batch: usize,
        params: &SamplingParams,
    ) -> Result<()> {
        for batch in next_batch..next_batch + self.rollouts.cfg().async_steps {
            if self.rollouts.sent_ahead(batch) {
                continue;
            }
            let (kept, requests) = self.train_batch_requests(batch, params)?;
            let seed = self.train_batch_seed(batch);
            self.rollouts.send_ahead(batch, kept, requests, seed)?;
        }
        Ok(())
    }

    /// This rank's requests for data batch `batch`: (kept example indices, requests), seeded as
    /// in [`Producer::rollout_groups`].
    fn train_batch_requests(
        &self,
        batch: usize,
        params: &SamplingParams,
    ) -> Result<(Vec<usize>, Vec<Request>)> {
        let (_, idx) = self.questions.draw(batch);
        let seed = self.train_batch_seed(batch);
        let mine = self.dist.shard(&idx, "data.train_batch_size")?;
        self.rollout_requests(
            self.questions.train(),
            mine,
            params,
            seed,
            self.dist.rank * mine.len(),
        )
    }

    /// The seed of data batch `batch`'s requests and engine.
    fn train_batch_seed(&self, batch: usize) -> u64 {
        mix(self.seed, batch as u64, TRAIN_SEED_SALT)
    }

    /// This rank's groups of data batch `batch`: from the batch sent ahead if there is one, else
    /// generated now with `learner`'s policy (version `policy_version`).
    fn train_batch_groups(
        &mut self,
        batch: usize,
        learner: &Learner,
        policy_version: u64,
        params: &SamplingParams,
    ) -> Result<Vec<Group>> {
        if let Some(ahead) = self.rollouts.take_ahead(batch) {
            let a = ahead?;
            return self.groups_from(self.questions.train(), &a.kept, a.samples, None, a.version);
        }
        let (kept, requests) = self.train_batch_requests(batch, params)?;
        let version = self.rollouts.sampling_version(policy_version);
        let seed = self.train_batch_seed(batch);
        let (samples, texts) = self.one_turn_rollouts(learner.model(), requests, seed, true)?;
        self.groups_from(self.questions.train(), &kept, samples, Some(texts), version)
    }
}
