//! The checks a config must pass beyond its types (each error names the key), and the
//! quantities derived from it.
use super::Config;

impl Config {
    /// Value checks that serde cannot express. Returns the first problem, naming the key.
    /// What a data-parallel run over `world` ranks needs of the batch sizes: every rank gets the
    /// same number of prompts and of responses in each mini-batch.
    pub fn check_world_size(&self, world: usize) -> anyhow::Result<()> {
        if world <= 1 {
            return Ok(());
        }
        let d = &self.data;
        if !d.train_batch_size.is_multiple_of(world) {
            anyhow::bail!(
                "data.train_batch_size = {} is not divisible by the world size {world}",
                d.train_batch_size
            );
        }
        let mini = self.actor.ppo_mini_batch_size * self.rollout.n;
        let rows = d.train_batch_size * self.rollout.n;
        if !mini.is_multiple_of(world) || !(rows % mini).is_multiple_of(world) {
            anyhow::bail!(
                "actor.ppo_mini_batch_size x rollout.n = {mini} responses per mini-batch (of {rows}) do not \
                 split evenly over the world size {world}"
            );
        }
        Ok(())
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        use anyhow::bail;
        if self.model.path.is_empty() {
            bail!("model.path is required (a model folder, `smollm2`, or `random:<config.json>`)");
        }
        self.rollout.validate()?;
        if self.rollout.async_steps > 0 && self.trainer.check_on_policy {
            bail!(
                "trainer.check_on_policy needs rollout.async_steps = 0 (with overlap the rollouts are up to \
                 {} policy versions old)",
                self.rollout.async_steps
            );
        }
        self.env.validate(self.rollout.n)?;
        if self.env.enabled() {
            // An environment's episodes are played, scored and given their advantages by the
            // environment: these act on a prompt run's groups and rewards only.
            for (on, key, why) in [
                (
                    self.algorithm.use_kl_in_reward,
                    "algorithm.use_kl_in_reward",
                    "the environment gives the advantages itself (a KL term goes in the loss: actor.use_kl_loss)",
                ),
                (
                    self.algorithm.filter_groups.enable,
                    "algorithm.filter_groups.enable",
                    "DAPO's group filter draws and resamples prompt groups, not environment episodes",
                ),
                (
                    self.reward.overlong_buffer.enable,
                    "reward.overlong_buffer.enable",
                    "the overlong penalty shapes a prompt run's rewards; the environment scores its episodes",
                ),
                (
                    self.rollout.partial_rollouts,
                    "rollout.partial_rollouts",
                    "an environment's rounds wait for each other's answers; its next episodes are played \
                     whole during the update (rollout.async_steps alone)",
                ),
            ] {
                if on {
                    bail!("{key} = true with env.name = {:?}: {why}", self.env.name);
                }
            }
        }
        let d = &self.data;
        // Environments with a built-in question set need no data files.
        if d.task.is_none() && d.train_files.is_empty() && !self.env.enabled() {
            bail!("data.train_files is empty and data.task is not set: nothing to train on");
        }
        crate::data::PromptTemplate::from_config(&d.prompt_template, None)?;
        for (k, v) in [
            ("data.train_batch_size", d.train_batch_size),
            ("data.max_response_length", d.max_response_length),
            ("data.max_prompt_length", d.max_prompt_length),
            ("actor.ppo_mini_batch_size", self.actor.ppo_mini_batch_size),
            ("actor.ppo_epochs", self.actor.ppo_epochs),
            ("actor.unembed_chunk", self.actor.unembed_chunk.unwrap_or(1)),
            ("rollout.n", self.rollout.n),
            ("rollout.max_num_seqs", self.rollout.max_num_seqs),
            ("eval.n", self.eval.n),
        ] {
            if v == 0 {
                bail!("{k} must be at least 1");
            }
        }
        if !d
            .train_batch_size
            .is_multiple_of(self.actor.ppo_mini_batch_size)
        {
            bail!(
                "data.train_batch_size ({}) must be a multiple of actor.ppo_mini_batch_size ({})",
                d.train_batch_size,
                self.actor.ppo_mini_batch_size
            );
        }
        if let Some(m) = self.actor.ppo_micro_batch_size_per_gpu {
            let mini = self.actor.ppo_mini_batch_size * self.rollout.n;
            if m == 0 || !mini.is_multiple_of(m) {
                bail!(
                    "actor.ppo_micro_batch_size_per_gpu ({m}) must divide the mini-batch of \
                     ppo_mini_batch_size x rollout.n = {mini} responses"
                );
            }
        }
        for (name, tau) in [
            ("tau_pos", self.actor.tau_pos),
            ("tau_neg", self.actor.tau_neg),
        ] {
            if !(tau.is_finite() && tau > 0.0) {
                bail!("actor.{name} = {tau}: must be a finite number > 0");
            }
        }
        let beta = self.actor.dro_beta;
        if !(beta.is_finite() && beta >= 0.0) {
            bail!("actor.dro_beta = {beta}: must be a finite number >= 0");
        }
        let ob = &self.reward.overlong_buffer;
        if ob.enable {
            let max = ob.max_resp_len.unwrap_or(self.data.max_response_length);
            if ob.len == 0 || ob.len > max {
                bail!(
                    "reward.overlong_buffer.len = {}: must be in 1..={max} (the response length \
                     limit, reward.overlong_buffer.max_resp_len or data.max_response_length)",
                    ob.len
                );
            }
            if !(ob.penalty_factor.is_finite() && ob.penalty_factor >= 0.0) {
                bail!(
                    "reward.overlong_buffer.penalty_factor = {}: must be a finite number >= 0",
                    ob.penalty_factor
                );
            }
        }
        let o = &self.actor.optim;
        if o.lr.is_nan() || o.lr < 0.0 || !o.lr.is_finite() {
            bail!("actor.optim.lr = {}: must be a finite number >= 0", o.lr);
        }
        if !(0.0..1.0).contains(&o.betas[0]) || !(0.0..1.0).contains(&o.betas[1]) {
            bail!("actor.optim.betas = {:?}: each must be in [0, 1)", o.betas);
        }
        if o.eps.is_nan() || o.eps <= 0.0 {
            bail!("actor.optim.eps = {}: must be > 0", o.eps);
        }
        if !(0.0..=1.0).contains(&o.lr_warmup_steps_ratio) {
            bail!(
                "actor.optim.lr_warmup_steps_ratio = {}: must be in [0, 1]",
                o.lr_warmup_steps_ratio
            );
        }
        if !(0.0..=1.0).contains(&o.min_lr_ratio) {
            bail!(
                "actor.optim.min_lr_ratio = {}: must be in [0, 1]",
                o.min_lr_ratio
            );
        }
        for (k, v) in [
            ("actor.clip_ratio", Some(self.actor.clip_ratio)),
            ("actor.clip_ratio_low", self.actor.clip_ratio_low),
            ("actor.clip_ratio_high", self.actor.clip_ratio_high),
        ] {
            if let Some(v) = v {
                if v.is_nan() || v < 0.0 {
                    bail!("{k} = {v}: must be >= 0");
                }
            }
        }
        if self.rollout.temperature.is_nan() || self.rollout.temperature < 0.0 {
            bail!(
                "rollout.temperature = {}: must be >= 0",
                self.rollout.temperature
            );
        }
        if self.rollout.top_p.is_nan() || self.rollout.top_p <= 0.0 || self.rollout.top_p > 1.0 {
            bail!("rollout.top_p = {}: must be in (0, 1]", self.rollout.top_p);
        }
        self.check_algorithm_names()?;
        if self.rollout.min_tokens > d.max_response_length {
            bail!(
                "rollout.min_tokens ({}) exceeds data.max_response_length ({})",
                self.rollout.min_tokens,
                d.max_response_length
            );
        }
        if self.trainer.max_ckpt_to_keep == Some(0) {
            bail!("trainer.max_ckpt_to_keep must be at least 1 (or unset to keep all)");
        }
        if self.trainer.check_on_policy && self.algorithm.rollout_correction.bypass_mode {
            bail!(
                "trainer.check_on_policy = true cannot hold with algorithm.rollout_correction.bypass_mode \
                 (old logprobs come from the sampler, so the first ratio is not exactly 1)"
            );
        }
        Ok(())
    }

    /// The rollout-correction thresholds (the algorithm names are parsed when the config loads).
    fn check_algorithm_names(&self) -> anyhow::Result<()> {
        let rc = &self.algorithm.rollout_correction;
        if rc.rollout_is.is_some() && rc.rollout_is_threshold <= 1.0 {
            anyhow::bail!("algorithm.rollout_correction.rollout_is_threshold must be > 1");
        }
        Ok(())
    }

    /// Number of optimizer-batch steps of the run (`total_training_steps` or epochs x batches).
    pub fn total_steps(&self, train_examples: usize) -> usize {
        self.trainer.total_training_steps.unwrap_or_else(|| {
            (train_examples / self.data.train_batch_size).max(1) * self.trainer.total_epochs
        })
    }
}
