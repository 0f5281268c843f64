//! Multi-turn environments for temper (the Tinker cookbook's `Env` / `EnvGroupBuilder` shape, in
//! tokens): an episode is a sequence of turns over one token transcript
//! ([`transcript::Transcript`]); the environment appends observation tokens, the policy samples
//! action tokens, and every turn's prompt is the transcript so far. An [`driver::EnvGroup`] holds
//! the episodes that share an advantage baseline; [`driver::run_groups`] advances many groups
//! together, one batched sampler call per round. Single-turn tasks are the one-turn case
//! ([`single_turn::SingleTurn`]); [`debate`] is self-play debate with a judge; [`train_data`]
//! turns finished episodes into per-token-advantage datums.
pub mod chat;
pub mod debate;
pub mod driver;
pub mod environment;
pub mod question_sets;
pub mod single_turn;
pub mod train_data;
pub mod transcript;

pub use chat::{ChatTurns, Codec};
pub use driver::{run_groups, Answer, Ask, EnvGroup, Responder, Responders};
pub use environment::{
    build_environment, datum_shape, environment_names, takes_a_task, DatumShape, EnvEntry, EnvRun,
    EnvSettings, Environment, GroupContext, GroupOutcome, ENVIRONMENTS,
};
pub use question_sets::{task_by_name, task_names, Question, Task, TASKS};
pub use train_data::{advantage_stats, Datum, DebateTrain};
pub use transcript::Transcript;
