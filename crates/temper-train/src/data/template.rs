//! How an example's prompt becomes the model's input text.
use super::Prompt;
use anyhow::{bail, Result};
use temper_model::{ChatMessage, Tokenizer};

/// The R1-Zero prompt (as in CS336 assignment 5): the model continues after `<think>`.
pub const R1_ZERO_TEMPLATE: &str = "A conversation between User and Assistant. The User asks a question, and the \
Assistant solves it. The Assistant first thinks about the reasoning process in the mind and then provides the User \
with the answer. The reasoning process is enclosed within <think> </think> and answer is enclosed within <answer> \
</answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>.\n\
User: {prompt}\nAssistant: <think>";

#[derive(Debug, Clone, PartialEq)]
pub enum PromptTemplate {
    /// The tokenizer's chat template, with an optional system message.
    Chat { system: Option<String> },
    /// A text template with `{prompt}` (`r1_zero` is one).
    Text(String),
    /// The prompt text as is.
    Raw,
}

impl PromptTemplate {
    pub fn from_config(name: &str, system: Option<&str>) -> Result<Self> {
        Ok(match name {
            "chat" => PromptTemplate::Chat { system: system.map(str::to_string) },
            "r1_zero" => PromptTemplate::Text(R1_ZERO_TEMPLATE.to_string()),
            "raw" => PromptTemplate::Raw,
            t if t.contains("{prompt}") => PromptTemplate::Text(t.to_string()),
            other => bail!("data.prompt_template = {other:?}: expected chat, r1_zero, raw or text with {{prompt}}"),
        })
    }

    /// The model input text for `prompt`.
    pub fn render(&self, prompt: &Prompt, tok: &Tokenizer) -> Result<String> {
        match (self, prompt) {
            (PromptTemplate::Chat { system }, p) => {
                let mut msgs = Vec::new();
                if let Some(s) = system {
                    msgs.push(ChatMessage::system(s.clone()));
                }
                match p {
                    Prompt::Text(t) => msgs.push(ChatMessage::user(t.clone())),
                    Prompt::Messages(m) => msgs.extend(
                        m.iter()
                            .map(|(r, c)| ChatMessage::new(r.clone(), c.clone())),
                    ),
                }
                if !tok.has_chat_template() {
                    bail!("data.prompt_template = \"chat\" but the tokenizer has no chat template (use raw or r1_zero)");
                }
                tok.apply_chat_template(&msgs, true)
            }
            (PromptTemplate::Text(t), p) => Ok(t.replace("{prompt}", p.text())),
            (PromptTemplate::Raw, Prompt::Text(t)) => Ok(t.clone()),
            (PromptTemplate::Raw, Prompt::Messages(_)) => {
                bail!("data.prompt_template = \"raw\" cannot render chat messages (use chat)")
            }
        }
    }
}
