//! temper-reward: the math grader (r1_zero, GSM8K, MATH answers), procedural tasks with their
//! verifiers, and rewards computed by an external command. Rewards implement [`Reward`] and are
//! chosen by name with [`reward_by_name`].
pub mod expr;
pub mod extract;
pub mod grader;
pub mod grader_options;
pub mod normalize;
pub mod ranked;

pub use grader::{
    answers_match, extract_answer, gold_answer, grade, Extraction, Graded, Grader, Unscored,
};
pub use grader_options::{ExtractionTargets, GraderOptions};
pub mod command;
pub mod math_reward;
pub mod reward;
pub mod scoring;
pub mod tasks;

pub use command::CommandReward;
pub use math_reward::{r1_zero, R1ZeroScore};
pub use reward::{reward_by_name, reward_names, Reward, RewardOutput, REWARDS};
pub use scoring::{score_all, score_checked, RewardFailure, ScoreInput};
pub use tasks::{procedural_task, Question, Task, PROCEDURAL_TASKS};
