//! `env`: a multi-turn environment instead of the single-turn prompt + reward path
//! (temper-env). `name` picks it: `qa`, `summary`, `sat` (one-turn tasks) or `debate` (two
//! debaters and a judge about a `task`'s questions). Empty = the usual `data` + `reward` path.
use anyhow::bail;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EnvConfig {
    /// `""` (off), `qa`, `summary`, `sat` or `debate`.
    pub name: String,
    /// The questions a debate argues about: `qa`, `summary` or `sat`.
    pub task: String,
    /// Questions from `data.train_files` (records with `question`/`answer`, or `article`);
    /// empty: the task's built-in set (qa: eight arithmetic questions; sat: seeded problems).
    /// Summary reward: `compression`, or weighted `compression:0.5,length:0.5` (also `fluency`).
    pub reward: String,
    /// Replaces the task's instruction (qa: answer in `<SOLUTION>` tags; summary: summarize).
    pub instruction: Option<String>,
    /// sat: the problems' seed string and a fixed difficulty in [0, 1] (default: from the seed).
    pub problem_seed: String,
    pub difficulty: Option<f64>,
    /// debate: `mock` (seeded coin), `confidence` (higher R1 `<CONFIDENCE>` wins), `policy` (the
    /// current policy judges) or `model` (a frozen model at `judge_model`).
    pub judge: String,
    pub judge_model: Option<String>,
    pub judge_temperature: f64,
    pub judge_max_tokens: usize,
    /// debate: `rejection`, `rs_grpo` or `r1_r23` (docs/environments.md).
    pub debate_train: String,
    /// rs_grpo: z-score the winners' rewards (population std, 0 when it is 0) instead of centring.
    pub grpo_std: bool,
    /// r1_r23: the R2/R3 token advantage of the winner (+c) and the loser (-c).
    pub r23_constant: f64,
    /// Round instructions (`r1` may use `{side}`); empty keeps the default.
    pub r1_instruction: String,
    pub r2_before: String,
    pub r2_after: String,
    pub r3_before: String,
    pub r3_after: String,
    /// A step whose token advantages are all 0 stops with "All token advantages are 0.0" unless
    /// this is set (then it is skipped with a warning).
    pub skip_zero_advantage: bool,
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig {
            name: String::new(),
            task: "qa".into(),
            reward: "compression".into(),
            instruction: None,
            problem_seed: "temper-sat".into(),
            difficulty: None,
            judge: "mock".into(),
            judge_model: None,
            judge_temperature: 0.3,
            judge_max_tokens: 256,
            debate_train: "rejection".into(),
            grpo_std: false,
            r23_constant: 1.0,
            r1_instruction: String::new(),
            r2_before: String::new(),
            r2_after: String::new(),
            r3_before: String::new(),
            r3_after: String::new(),
            skip_zero_advantage: false,
        }
    }
}

/// `env.name` of a debate (any other name is a task's, run one turn).
pub const DEBATE: &str = "debate";

impl EnvConfig {
    pub fn is_debate(&self) -> bool {
        self.name == DEBATE
    }

    pub fn enabled(&self) -> bool {
        !self.name.is_empty()
    }

    /// The task the questions come from: `env.task` for an environment that asks another
    /// task's questions (a debate), else the one `env.name` names.
    pub fn task_name(&self) -> &str {
        if temper_env::takes_a_task(&self.name) {
            &self.task
        } else {
            &self.name
        }
    }

    pub fn validate(&self, n: usize) -> anyhow::Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        let tasks = temper_env::task_names();
        if self.name != DEBATE && !tasks.contains(&self.name.as_str()) {
            bail!(
                "env.name = {:?}: expected {DEBATE} or a task: {}",
                self.name,
                tasks.join(", ")
            );
        }
        if !tasks.contains(&self.task_name()) {
            bail!(
                "env.task = {:?}: expected one of {}",
                self.task,
                tasks.join(", ")
            );
        }
        if self.is_debate() {
            if !n.is_multiple_of(2) {
                bail!(
                    "rollout.n = {n}: a debate has two debaters, so the rollouts per question must be even"
                );
            }
            temper_env::debate::judge::JudgeKind::parse(&self.judge)?;
            if self.judge == "model" && self.judge_model.as_deref().unwrap_or("").is_empty() {
                bail!("env.judge = \"model\" needs env.judge_model (a model folder or name)");
            }
            temper_env::DebateTrain::parse(&self.debate_train, self.grpo_std, self.r23_constant)?;
            if !(self.judge_temperature >= 0.0 && self.judge_temperature.is_finite()) {
                bail!("env.judge_temperature must be >= 0");
            }
        }
        Ok(())
    }
}
