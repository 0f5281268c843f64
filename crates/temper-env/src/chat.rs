//! Chat-template tokens for multi-turn episodes: the first prompt of a conversation, and the
//! continuation that follows an assistant turn (close it, a user turn, open the next assistant
//! turn). The continuation strings are read off the model's own chat template by rendering a
//! conversation whose messages are sentinels, so any template works without per-model code.
use anyhow::{bail, Context, Result};
use temper_model::{ChatMessage, Tokenizer};

/// What an environment needs from a tokenizer.
pub trait Codec: Send + Sync {
    /// Token ids of `text` (special-token strings in it become their ids; no BOS added).
    fn encode(&self, text: &str) -> Result<Vec<i64>>;
    /// Text of `ids` without special tokens (for rewards, judges and logs).
    fn decode(&self, ids: &[i64]) -> Result<String>;
    /// The string a token id stands for, special tokens included (`<|im_end|>`).
    fn token_text(&self, id: i64) -> Option<String>;
    /// The chat template applied to `messages` (with the assistant generation prompt).
    fn render(&self, messages: &[ChatMessage]) -> Result<String>;
}

impl Codec for Tokenizer {
    fn encode(&self, text: &str) -> Result<Vec<i64>> {
        Tokenizer::encode(self, text, false)
    }
    fn decode(&self, ids: &[i64]) -> Result<String> {
        Tokenizer::decode(self, ids, true)
    }
    fn token_text(&self, id: i64) -> Option<String> {
        self.id_to_token(id)
    }
    fn render(&self, messages: &[ChatMessage]) -> Result<String> {
        if !self.has_chat_template() {
            bail!(
                "the model's tokenizer has no chat template (tokenizer_config.json chat_template); multi-turn \
                 environments need one to close and open turns"
            );
        }
        self.apply_chat_template(messages, true)
    }
}

const A1: &str = "\u{27e6}A1\u{27e7}";
const U2: &str = "\u{27e6}U2\u{27e7}";

/// The template text between turns.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatTurns {
    /// After an assistant message, up to the next user message's content
    /// (ChatML: `<|im_end|>\n<|im_start|>user\n`).
    pub assistant_to_user: String,
    /// After a user message's content, up to the assistant's content
    /// (ChatML: `<|im_end|>\n<|im_start|>assistant\n`).
    pub user_to_assistant: String,
}

impl ChatTurns {
    pub fn from_template(codec: &dyn Codec) -> Result<Self> {
        let msgs = [
            ChatMessage::user("\u{27e6}U1\u{27e7}"),
            ChatMessage::assistant(A1),
            ChatMessage::user(U2),
        ];
        let text = codec
            .render(&msgs)
            .context("rendering a user/assistant/user conversation with the chat template")?;
        let after_a1 = text.find(A1).map(|k| k + A1.len());
        let u2 = text.find(U2);
        match (after_a1, u2) {
            (Some(a), Some(u)) if a <= u => Ok(ChatTurns {
                assistant_to_user: text[a..u].to_string(),
                user_to_assistant: text[u + U2.len()..].to_string(),
            }),
            _ => bail!(
                "the chat template does not render an assistant turn followed by a user turn verbatim (got {text:?})"
            ),
        }
    }

    /// Tokens that follow a sampled completion to start a user turn: the closing part of
    /// `assistant_to_user` that the completion did not already sample (its EOS, typically).
    pub fn after_completion(&self, codec: &dyn Codec, completion: &[i64]) -> Result<Vec<i64>> {
        let mut rest = self.assistant_to_user.as_str();
        if let Some(last) = completion.last().and_then(|&t| codec.token_text(t)) {
            if !last.is_empty() {
                if let Some(r) = rest.strip_prefix(last.as_str()) {
                    rest = r;
                }
            }
        }
        codec.encode(rest)
    }

    /// The observation injected between two turns of one agent:
    /// [close the assistant turn] `before` [spliced ids] `after` [open the assistant turn].
    /// `spliced` are token ids copied as they are (an opponent's sampled tokens).
    pub fn continuation(
        &self,
        codec: &dyn Codec,
        completion: &[i64],
        before: &str,
        spliced: &[i64],
        after: &str,
    ) -> Result<Vec<i64>> {
        let mut out = self.after_completion(codec, completion)?;
        out.extend(codec.encode(before)?);
        out.extend_from_slice(spliced);
        out.extend(codec.encode(&format!("{after}{}", self.user_to_assistant))?);
        Ok(out)
    }
}

/// The first prompt of a conversation: optional system message and the user's message.
pub fn first_prompt(codec: &dyn Codec, system: Option<&str>, user: &str) -> Result<Vec<i64>> {
    let mut msgs = vec![];
    if let Some(s) = system {
        msgs.push(ChatMessage::system(s));
    }
    msgs.push(ChatMessage::user(user));
    codec.encode(&codec.render(&msgs)?)
}
