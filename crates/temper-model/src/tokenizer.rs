//! The tokenizer of an HF folder (`tokenizer.json` via the `tokenizers` crate) with the special tokens
//! and chat template of `tokenizer_config.json` (or `chat_template.jinja`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use minijinja::value::Value as JinjaValue;
use serde_json::Value;

use crate::chat_template::{ChatMessage, ChatTemplate};

/// Tokenizer + special tokens + chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<ChatTemplate>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    dir: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("dir", &self.dir)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("pad_token", &self.pad_token)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

/// `"<s>"` or `{"content": "<s>", ...}` (AddedToken) → the token text.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not valid JSON", path.display()))
}

impl Tokenizer {
    /// `dir`'s tokenizer when the folder has a `tokenizer.json`, else None. One that exists but
    /// does not load is an error, never a model without a tokenizer.
    pub fn from_dir_if_present(dir: &Path) -> Result<Option<Self>> {
        if !dir.join("tokenizer.json").is_file() {
            return Ok(None);
        }
        Self::from_dir(dir)
            .map(Some)
            .with_context(|| format!("tokenizer of {}", dir.display()))
    }

    /// Load `tokenizer.json`, plus `tokenizer_config.json` / `special_tokens_map.json` /
    /// `chat_template.jinja` when present.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            bail!("{} not found", tok_path.display());
        }
        let inner = tokenizers::Tokenizer::from_file(&tok_path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", tok_path.display()))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = if cfg_path.is_file() {
            read_json(&cfg_path)?
        } else {
            Value::Null
        };
        let map_path = dir.join("special_tokens_map.json");
        let map = if map_path.is_file() {
            read_json(&map_path)?
        } else {
            Value::Null
        };
        // transformers reads tokenizer_config.json; special_tokens_map.json fills what it lacks.
        let special = |key: &str| token_text(cfg.get(key)).or_else(|| token_text(map.get(key)));
        let mut specials: Vec<(String, JinjaValue)> = Vec::new();
        for key in [
            "bos_token",
            "eos_token",
            "unk_token",
            "sep_token",
            "pad_token",
            "cls_token",
            "mask_token",
        ] {
            if let Some(t) = special(key) {
                specials.push((key.to_string(), JinjaValue::from(t)));
            }
        }
        if let Some(Value::Array(extra)) = cfg
            .get("additional_special_tokens")
            .or_else(|| map.get("additional_special_tokens"))
        {
            let list: Vec<String> = extra.iter().filter_map(|v| token_text(Some(v))).collect();
            specials.push(("additional_special_tokens".into(), JinjaValue::from(list)));
        }
        let jinja_path = dir.join("chat_template.jinja");
        let source = if jinja_path.is_file() {
            Some(
                std::fs::read_to_string(&jinja_path)
                    .with_context(|| format!("reading {}", jinja_path.display()))?,
            )
        } else {
            match cfg.get("chat_template") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                // A list of named templates: use "default".
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .map(str::to_string),
                Some(other) => bail!(
                    "{}: chat_template is neither a string nor a list: {other}",
                    cfg_path.display()
                ),
            }
        };
        let chat_template = match source {
            Some(src) => Some(
                ChatTemplate::new(&src, specials)
                    .with_context(|| format!("chat template of {}", dir.display()))?,
            ),
            None => None,
        };
        Ok(Tokenizer {
            inner,
            chat_template,
            bos_token: special("bos_token"),
            eos_token: special("eos_token"),
            pad_token: special("pad_token"),
            dir: dir.to_path_buf(),
        })
    }

    /// Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor (e.g. BOS).
    /// Text rendered by a chat template already holds its special tokens: encode it with `false`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<i64>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
        Ok(enc.get_ids().iter().map(|&i| i as i64).collect())
    }

    pub fn decode(&self, ids: &[i64], skip_special_tokens: bool) -> Result<String> {
        let ids: Vec<u32> = ids
            .iter()
            .map(|&i| u32::try_from(i).map_err(|_| anyhow::anyhow!("token id {i} out of range")))
            .collect::<Result<_>>()?;
        self.inner
            .decode(&ids, skip_special_tokens)
            .map_err(|e| anyhow::anyhow!("decoding: {e}"))
    }

    /// The text of one token id (its vocabulary entry), if any.
    pub fn id_to_token(&self, id: i64) -> Option<String> {
        u32::try_from(id)
            .ok()
            .and_then(|i| self.inner.id_to_token(i))
    }

    pub fn token_to_id(&self, token: &str) -> Option<i64> {
        self.inner.token_to_id(token).map(i64::from)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }
    pub fn pad_token(&self) -> Option<&str> {
        self.pad_token.as_deref()
    }
    pub fn bos_id(&self) -> Option<i64> {
        self.bos_token.as_deref().and_then(|t| self.token_to_id(t))
    }
    pub fn eos_id(&self) -> Option<i64> {
        self.eos_token.as_deref().and_then(|t| self.token_to_id(t))
    }
    pub fn pad_id(&self) -> Option<i64> {
        self.pad_token.as_deref().and_then(|t| self.token_to_id(t))
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// The ids of a conversation to answer: rendered with the chat template and its generation
    /// prompt, then encoded without adding special tokens (the template writes them), as
    /// transformers' `apply_chat_template(messages, add_generation_prompt=True)` tokenizes.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<i64>> {
        self.encode(&self.apply_chat_template(messages, true)?, false)
    }

    /// The ids of a prompt given as text: with `chat`, the text as one user message
    /// ([`Tokenizer::encode_chat`]); else the text with the tokenizer's own special tokens (a
    /// BOS where it adds one), as `tokenizer(text)` does.
    pub fn encode_prompt(&self, text: &str, chat: bool) -> Result<Vec<i64>> {
        if chat {
            self.encode_chat(&[ChatMessage::user(text)])
        } else {
            self.encode(text, true)
        }
    }

    /// Render a conversation like transformers' `apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=...)`.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.apply_chat_template_with(messages, add_generation_prompt, &[])
    }

    /// Same, with extra template variables (e.g. `("enable_thinking", false.into())` for Qwen3).
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &[(&str, JinjaValue)],
    ) -> Result<String> {
        let t = self.chat_template.as_ref().with_context(|| {
            format!(
                "{} has no chat template (tokenizer_config.json chat_template)",
                self.dir.display()
            )
        })?;
        t.render(messages, add_generation_prompt, extra)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
