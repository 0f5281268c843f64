//! The questions part of a run: the training and validation sets, the order batches are drawn in,
//! the prompt template and length policy, and the reward that scores answers, with the config
//! sections these read (`data`, `reward`, `algorithm.filter_groups`).
use crate::config::{DataConfig, FilterGroupsConfig, RewardConfig, Truncation};
use crate::data::{DataOrder, Dataset, Example, PromptTemplate};
use anyhow::{bail, Context, Result};
use temper_model::Tokenizer;
use temper_reward::Reward;

pub(crate) struct Questions {
    pub(super) train: Dataset,
    /// `data.val_files` (none for an environment run).
    pub(super) val: Option<Dataset>,
    pub(super) order: DataOrder,
    pub(super) template: PromptTemplate,
    pub(super) reward: Box<dyn Reward>,
    /// The `data` section: prompt and response lengths, the batch size.
    pub(super) data: DataConfig,
    /// The `reward` section: errors, the overlong penalty.
    pub(super) reward_cfg: RewardConfig,
    /// `algorithm.filter_groups`: DAPO's dynamic sampling while drawing a step's groups.
    pub(super) filter_groups: FilterGroupsConfig,
}

impl Questions {
    /// The prompt token ids of an example, after the template and the length policy; `None` when
    /// `data.filter_overlong_prompts` drops it.
    pub(crate) fn prompt_ids(
        &self,
        tokenizer: &Tokenizer,
        ex: &Example,
        where_: &str,
    ) -> Result<Option<Vec<i64>>> {
        let text = self
            .template
            .render(&ex.prompt, tokenizer)
            .with_context(|| where_.to_string())?;
        let mut ids = tokenizer
            .encode(&text, false)
            .with_context(|| where_.to_string())?;
        let max = self.data.max_prompt_length;
        if ids.len() > max {
            if self.data.filter_overlong_prompts {
                return Ok(None);
            }
            match self.data.truncation {
                Truncation::Left => ids.drain(..ids.len() - max).for_each(drop),
                Truncation::Right => ids.truncate(max),
                Truncation::Error => bail!(
                    "{where_}: prompt has {} tokens > data.max_prompt_length = {max} (set data.truncation = left|right \
                     or data.filter_overlong_prompts = true)",
                    ids.len()
                ),
            }
        }
        if ids.is_empty() {
            bail!("{where_}: the prompt is empty after tokenization");
        }
        Ok(Some(ids))
    }
}
