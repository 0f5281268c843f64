//! What callers outside the trainer read or set (the fields themselves are private).
use super::{ParamsHook, Trainer};
use crate::checkpoint::TrainerState;
use crate::data::Dataset;
use crate::dist::Dist;
use crate::rundir::RunDir;
use temper_model::CausalLm;
use temper_reward::Reward;

/// What callers outside the trainer read or set: the run folder, the rank, the data, the progress,
/// the policy, and the seams the tests and benchmarks use.
impl Trainer {
    /// The run folder (rank 0's; a scratch folder on other ranks).
    pub fn run(&self) -> &RunDir {
        &self.run
    }

    /// This process's place in the data-parallel job.
    pub fn dist(&self) -> &Dist {
        &self.dist
    }

    /// The training data set.
    pub fn train_data(&self) -> &Dataset {
        self.producer.train_data()
    }

    /// Steps done (and the other resumable counters).
    pub fn state(&self) -> &TrainerState {
        &self.state
    }

    /// The run's length in steps.
    pub fn total_steps(&self) -> usize {
        self.total_steps
    }

    /// The policy being trained. With `actor.strategy = "fsdp"` over several ranks (or with
    /// offload) its decoder layers' matrices are empty between steps: each rank holds slices
    /// ([`Trainer::whole_model`] gathers them).
    pub fn model(&self) -> &CausalLm {
        self.learner.model()
    }

    /// The policy with every weight whole: a sharded run's decoder layers gathered from the
    /// ranks' slices (a collective: every rank calls it), kept until the next step lets them go.
    /// Replicated, the same as [`Trainer::model`].
    pub fn whole_model(&self) -> anyhow::Result<&CausalLm> {
        self.learner.optimizer().hold_whole()?;
        Ok(self.learner.model())
    }

    /// Replaces the configured reward (tests and benchmarks score with their own).
    pub fn set_reward(&mut self, reward: Box<dyn Reward>) {
        self.producer.set_reward(reward);
    }

    /// `--stop-after`: end (with a checkpoint) after this many steps in this process.
    pub fn set_stop_after(&mut self, steps: Option<usize>) {
        self.stop_after = steps;
    }

    /// Writes a Chrome trace of step `step` (libtorch's profiler, every op with its shapes) to
    /// the run folder as `profile_step_<step>.json` (`.rank<R>` before `.json` for ranks > 0).
    pub fn set_profile_step(&mut self, step: Option<usize>) {
        self.profile_step = step;
    }

    /// A test seam: `hook` sees the parameters between a step's old-logprob pass and its update.
    #[doc(hidden)]
    pub fn set_before_update(&mut self, hook: ParamsHook) {
        self.before_update = Some(hook);
    }
}
