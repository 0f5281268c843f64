//! TOML file + dotted overrides -> [`Config`], with verl key paths as aliases and every key checked.
use super::verl_keys::{verl_key_use, VerlKeyUse};
use super::Config;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::path::Path;

/// Where a key's value came from, for error messages.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigSource {
    File(String),
    Override(String),
}

impl std::fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigSource::File(p) => write!(f, "config {p}"),
            ConfigSource::Override(o) => write!(f, "override `{o}`"),
        }
    }
}

/// A loaded, validated config and the non-fatal notes made on the way (ignored verl keys).
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub warnings: Vec<String>,
}

/// Tables whose keys are free-form (passed through to a task or reward), never checked here.
const FREE_FORM: &[&str] = &["data.task_args", "reward.kwargs"];

/// verl path prefixes rewritten to temper's sections (longest first).
const PREFIX_ALIASES: &[(&str, &str)] = &[
    ("actor_rollout_ref.rollout.val_kwargs.", "eval."),
    ("actor_rollout_ref.actor.", "actor."),
    ("actor_rollout_ref.rollout.", "rollout."),
    ("actor_rollout_ref.model.", "model."),
    ("rollout.val_kwargs.", "eval."),
    // DAPO's overlong penalty: verl's trainer config, and its reward manager's kwargs.
    ("reward_model.overlong_buffer.", "reward.overlong_buffer."),
    (
        "reward_model.reward_kwargs.overlong_buffer_cfg.",
        "reward.overlong_buffer.",
    ),
];

/// Single keys spelled differently elsewhere (verl, CS336, slime) -> temper's key.
const KEY_ALIASES: &[(&str, &str)] = &[
    ("actor.lr", "actor.optim.lr"),
    ("actor.optim.warmup_style", "actor.optim.lr_scheduler_type"),
    // verl's Megatron optimizer spells the schedule this way.
    (
        "actor.optim.lr_decay_style",
        "actor.optim.lr_scheduler_type",
    ),
    ("model.lora.rank", "model.lora_rank"),
    ("model.lora.alpha", "model.lora_alpha"),
    ("model.torch_dtype", "model.dtype"),
    // verl's name (under actor_rollout_ref.model).
    (
        "model.enable_gradient_checkpointing",
        "actor.gradient_checkpointing",
    ),
    (
        "reward_model.reward_kwargs.max_resp_len",
        "reward.overlong_buffer.max_resp_len",
    ),
    ("actor.optim.clip_grad", "actor.grad_clip"),
    ("actor.epochs_per_rollout_batch", "actor.ppo_epochs"),
    ("actor.loss_mode", "actor.policy_loss.loss_mode"),
    ("actor.eps_clip", "actor.clip_ratio_low"),
    ("actor.eps_clip_high", "actor.clip_ratio_high"),
    ("trainer.max_actor_ckpt_to_keep", "trainer.max_ckpt_to_keep"),
    ("rollout.response_length", "data.max_response_length"),
    ("rollout.prompt_length", "data.max_prompt_length"),
    // grail's offline GRPO trainer.
    ("generation.backend", "rollout.backend"),
    ("generation.base_url", "rollout.base_urls"),
];

/// Values given as one where a list is meant (one URL, one target module, one logger).
fn normalize_value(key: &str, v: toml::Value) -> toml::Value {
    use toml::Value::{Array, String};
    match (key, v) {
        ("rollout.base_urls" | "model.target_modules" | "trainer.logger", one @ String(_)) => {
            Array(vec![one])
        }
        (_, v) => v,
    }
}

/// Loads `file` (if any), applies `overrides` (`a.b.c=value`, value parsed as TOML, else taken as
/// a string), checks every key, and validates the values.
pub fn load_config(file: Option<&Path>, overrides: &[String]) -> Result<Loaded> {
    let (text, name) = match file {
        Some(p) => (
            std::fs::read_to_string(p)
                .with_context(|| format!("reading config {}", p.display()))?,
            p.display().to_string(),
        ),
        None => (String::new(), "<none>".to_string()),
    };
    load_config_str(&text, &name, overrides)
}

/// [`load_config`] on TOML text; `name` is used in messages.
pub fn load_config_str(text: &str, name: &str, overrides: &[String]) -> Result<Loaded> {
    let schema = Schema::new();
    let mut warnings = Vec::new();
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| anyhow!("config {name}: {}", one_line(&e.to_string())))?;
    let file_src = ConfigSource::File(name.to_string());
    let mut leaves: BTreeMap<String, (toml::Value, ConfigSource)> = BTreeMap::new();
    let mut flat = Vec::new();
    flatten("", toml::Value::Table(table), &mut flat);
    for (path, value) in flat {
        if let Some(key) = schema.canonical(&path, Some(&value), &file_src, &mut warnings)? {
            if leaves.contains_key(&key) {
                bail!("{file_src}: `{key}` is set twice (`{path}` is another name for it)");
            }
            let value = normalize_value(&key, value);
            leaves.insert(key, (value, file_src.clone()));
        }
    }
    for o in overrides {
        let ov = parse_hydra_override(o)?;
        let src = ConfigSource::Override(o.clone());
        let value = match (ov.op, ov.value) {
            (HydraOp::Delete, _) | (_, None) => {
                // `~key` and `key=null`: back to temper's default.
                if let Some(key) = schema.canonical(&ov.key, None, &src, &mut warnings)? {
                    let set = leaves
                        .keys()
                        .any(|k| k == &key || k.starts_with(&format!("{key}.")));
                    if ov.op == HydraOp::Delete && !set {
                        bail!("{src}: `{key}` is not set, so there is nothing to delete");
                    }
                    leaves.retain(|k, _| k != &key && !k.starts_with(&format!("{key}.")));
                }
                continue;
            }
            (_, Some(v)) => v,
        };
        let mut flat = Vec::new();
        flatten(&ov.key, value, &mut flat);
        for (path, value) in flat {
            if let Some(key) = schema.canonical(&path, Some(&value), &src, &mut warnings)? {
                if ov.op == HydraOp::Add {
                    if let Some((_, from)) = leaves.get(&key) {
                        bail!(
                            "{src}: `{key}` is already set (by {from}); `+` adds a key that is not \
                             set: use `++{}` to override it",
                            o.trim_start_matches('+')
                        );
                    }
                }
                let value = normalize_value(&key, value);
                leaves.insert(key, (value, src.clone()));
            }
        }
    }
    let mut root = toml::Table::new();
    for (key, (value, _)) in &leaves {
        insert_path(&mut root, key, value.clone());
    }
    let config: Config =
        serde_path_to_error::deserialize(toml::Value::Table(root)).map_err(|e| {
            let key = e.path().to_string();
            let src = leaves
                .iter()
                .find(|(k, _)| key.starts_with(k.as_str()) || k.starts_with(&key))
                .map(|(_, (_, s))| s.to_string())
                .unwrap_or_else(|| format!("config {name}"));
            // toml ends its message with "in `key`", already said in front.
            let msg = one_line(&e.inner().to_string());
            let msg = msg.trim_end().trim_end_matches(&format!(" in `{key}`"));
            anyhow!("{src}: `{key}`: {msg}")
        })?;
    config
        .validate()
        .with_context(|| format!("config {name}"))?;
    Ok(Loaded { config, warnings })
}

/// How temper takes a key of a verl command line or config.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyClass {
    /// One of temper's settings (named here in temper's spelling).
    Mapped(String),
    /// Accepted with a warning giving the reason it has no effect.
    Ignored(&'static str),
    /// An error giving the reason it cannot apply.
    Refused(&'static str),
    /// Neither: an error with a did-you-mean.
    Unknown,
}

/// How `path` (set to `value`; `None` for null or a deletion) is taken: what
/// [`load_config`] does with it.
pub fn classify_key(path: &str, value: Option<&toml::Value>) -> KeyClass {
    Schema::new().classify(path, value)
}

/// Splits `a.b=value` and parses the value as a TOML value (bare words become strings).
pub fn parse_override(o: &str) -> Result<(String, toml::Value)> {
    let ov = parse_hydra_override(o)?;
    match (ov.op, ov.value) {
        (HydraOp::Set, Some(v)) => Ok((ov.key, v)),
        _ => bail!("override `{o}`: expected KEY=VALUE (e.g. actor.optim.lr=1e-6)"),
    }
}

/// What a Hydra override does to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HydraOp {
    /// `key=value`
    Set,
    /// `+key=value`: a key that is not set yet.
    Add,
    /// `++key=value`: set, whether set before or not.
    Force,
    /// `~key` (or `~key=value`): back to the default.
    Delete,
}

/// One command-line override in Hydra's grammar (what verl's run scripts pass).
#[derive(Debug, Clone, PartialEq)]
pub struct HydraOverride {
    pub op: HydraOp,
    pub key: String,
    /// `None`: `null` / `None` (the key's default) or a deletion.
    pub value: Option<toml::Value>,
}

/// Parses `key=value`, `+key=value`, `++key=value` or `~key[=value]`. Values: Hydra's `True` /
/// `False` / `true` / `false`, `null` / `None`, numbers, quoted strings (which may hold `=` and
/// `,`), lists quoted or not (`[a,b]`, `['a','b']`), else TOML, else the text as a string.
pub fn parse_hydra_override(o: &str) -> Result<HydraOverride> {
    let (op, rest) = if let Some(r) = o.strip_prefix("++") {
        (HydraOp::Force, r)
    } else if let Some(r) = o.strip_prefix('+') {
        (HydraOp::Add, r)
    } else if let Some(r) = o.strip_prefix('~') {
        (HydraOp::Delete, r)
    } else {
        (HydraOp::Set, o)
    };
    let (k, v) = match (op, rest.split_once('=')) {
        (_, Some((k, v))) => (k, Some(v)),
        (HydraOp::Delete, None) => (rest, None),
        _ => bail!("override `{o}`: expected KEY=VALUE (e.g. actor.optim.lr=1e-6)"),
    };
    let k = k.trim();
    if k.is_empty() || k.split('.').any(|s| s.is_empty()) {
        bail!("override `{o}`: bad key `{k}`");
    }
    let value = match (op, v) {
        (HydraOp::Delete, _) | (_, None) => None,
        (_, Some(v)) => hydra_value(v.trim()).map_err(|e| anyhow!("override `{o}`: {e}"))?,
    };
    Ok(HydraOverride {
        op,
        key: k.to_string(),
        value,
    })
}

/// One Hydra value; `None` for null.
fn hydra_value(v: &str) -> Result<Option<toml::Value>> {
    match v {
        "True" | "true" => return Ok(Some(toml::Value::Boolean(true))),
        "False" | "false" => return Ok(Some(toml::Value::Boolean(false))),
        "null" | "None" => return Ok(None),
        _ => {}
    }
    if v.contains("${") {
        bail!("interpolation (`${{...}}`) is not supported; write the value itself");
    }
    check_balanced(v)?;
    if let Some(inner) = v.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
        if let Some(list) = parse_toml_value(v) {
            return Ok(Some(list));
        }
        let items = super::sweep::split_top_level(inner)
            .into_iter()
            .filter(|s| !s.is_empty())
            .map(|item| hydra_value(&item)?.ok_or_else(|| anyhow!("null inside a list `{v}`")))
            .collect::<Result<Vec<_>>>()?;
        return Ok(Some(toml::Value::Array(items)));
    }
    Ok(Some(parse_value(v)))
}

/// Brackets and quotes that open must close (outside quotes).
fn check_balanced(v: &str) -> Result<()> {
    let (mut depth, mut quote) = (0i32, None::<char>);
    for c in v.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => {
                depth -= 1;
                if depth < 0 {
                    bail!("unbalanced brackets in `{v}`");
                }
            }
            _ => {}
        }
    }
    if let Some(q) = quote {
        bail!("unclosed {q} quote in `{v}`");
    }
    if depth != 0 {
        bail!("unbalanced brackets in `{v}`");
    }
    Ok(())
}

fn parse_toml_value(v: &str) -> Option<toml::Value> {
    format!("v = {v}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
}

/// A value as TOML (`1e-6`, `true`, `[1, 2]`, `"x"`), or the raw text as a string.
pub(crate) fn parse_value(v: &str) -> toml::Value {
    parse_toml_value(v).unwrap_or_else(|| toml::Value::String(v.to_string()))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Leaves of a TOML value as (dotted path, value); free-form tables stay whole.
fn flatten(prefix: &str, v: toml::Value, out: &mut Vec<(String, toml::Value)>) {
    match v {
        toml::Value::Table(t) if !FREE_FORM.iter().any(|f| canonical_prefix(prefix) == *f) => {
            for (k, v) in t {
                let p = if prefix.is_empty() {
                    k
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&p, v, out);
            }
        }
        v => out.push((prefix.to_string(), v)),
    }
}

fn canonical_prefix(path: &str) -> String {
    let dotted = format!("{path}.");
    for (from, to) in PREFIX_ALIASES {
        if let Some(rest) = dotted.strip_prefix(from) {
            return format!("{to}{rest}").trim_end_matches('.').to_string();
        }
    }
    path.to_string()
}

fn insert_path(root: &mut toml::Table, key: &str, value: toml::Value) {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().expect("non-empty key");
    let mut t = root;
    for p in parts {
        t = t
            .entry(p)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .expect("schema paths are sections");
    }
    t.insert(last.to_string(), value);
}

/// The known keys: the leaves of the serialized default config.
struct Schema {
    leaves: Vec<String>,
}

impl Schema {
    fn new() -> Self {
        let json = serde_json::to_value(Config::default()).expect("config serializes");
        let mut leaves = Vec::new();
        collect_leaves("", &json, &mut leaves);
        Schema { leaves }
    }

    /// `path` in temper's spelling: verl's prefixes rewritten, then single-key aliases.
    fn canonical_name(path: &str) -> String {
        let key = canonical_prefix(path);
        match KEY_ALIASES.iter().find(|(from, _)| *from == key) {
            Some((_, to)) => to.to_string(),
            None => key,
        }
    }

    /// The temper key for `path`, `None` for an ignored verl key, or an error for an unknown one.
    fn canonical(
        &self,
        path: &str,
        value: Option<&toml::Value>,
        src: &ConfigSource,
        warnings: &mut Vec<String>,
    ) -> Result<Option<String>> {
        match self.classify(path, value) {
            KeyClass::Mapped(key) => Ok(Some(key)),
            KeyClass::Ignored(reason) => {
                warnings.push(format!("{src}: ignoring verl key `{path}`: {reason}"));
                Ok(None)
            }
            KeyClass::Refused(reason) => {
                bail!("{src}: verl key `{path}` cannot apply in temper: {reason}")
            }
            KeyClass::Unknown => {
                let mut msg = format!("{src}: unknown key `{path}`");
                if let Some(s) = self.suggest(&Self::canonical_name(path)) {
                    msg.push_str(&format!(" (did you mean `{s}`?)"));
                }
                bail!(msg)
            }
        }
    }

    /// How `path` set to `value` is taken (see [`classify_key`]).
    fn classify(&self, path: &str, value: Option<&toml::Value>) -> KeyClass {
        let key = Self::canonical_name(path);
        match verl_key_use(&key, value) {
            // A key temper has wins over an ignored prefix above it (`actor.fsdp_config.*`).
            Some(VerlKeyUse::Ignored(_)) if self.leaves.contains(&key) => KeyClass::Mapped(key),
            Some(VerlKeyUse::Ignored(reason)) => KeyClass::Ignored(reason),
            Some(VerlKeyUse::Refused(reason)) => KeyClass::Refused(reason),
            None if self.leaves.contains(&key)
                || FREE_FORM
                    .iter()
                    .any(|f| key.strip_prefix(f).is_some_and(|r| r.starts_with('.'))) =>
            {
                KeyClass::Mapped(key)
            }
            None => KeyClass::Unknown,
        }
    }

    /// The closest known key (or alias), by edit distance on the whole path or on its last part.
    fn suggest(&self, key: &str) -> Option<String> {
        let last = |s: &str| s.rsplit('.').next().unwrap_or(s).to_string();
        let names = self
            .leaves
            .iter()
            .cloned()
            .chain(KEY_ALIASES.iter().map(|(a, _)| a.to_string()));
        let (best, d) = names
            .map(|c| {
                let whole = strsim::levenshtein(key, &c);
                let tail = strsim::levenshtein(&last(key), &last(&c)) + 1;
                let d = whole.min(tail);
                (c, d)
            })
            .min_by_key(|(_, d)| *d)?;
        let limit = (last(key).len() / 3).max(2);
        (d <= limit).then_some(best)
    }
}

fn collect_leaves(prefix: &str, v: &Json, out: &mut Vec<String>) {
    match v {
        Json::Object(m) if !FREE_FORM.contains(&prefix) => {
            for (k, v) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                collect_leaves(&p, v, out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}
