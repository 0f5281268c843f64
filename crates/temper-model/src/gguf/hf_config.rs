//! The HF `config.json` and `generation_config.json` of a GGUF model, from its metadata
//! (`{arch}.block_count`, `{arch}.attention.head_count`, ...) and tensor shapes.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::reader::{GgufFile, MetaValue};

pub use crate::config::Arch;

/// The decoder family of a GGUF `general.architecture` (llama.cpp uses HF's `model_type` names).
fn arch_from_gguf(name: &str) -> Result<Arch> {
    match Arch::from_name(name) {
        Some(arch) if arch.model_type() == name => Ok(arch),
        _ => bail!("unsupported architecture '{name}' (supported: llama, qwen2, qwen3)"),
    }
}

/// Model dimensions read from the metadata, checked against each other.
#[derive(Clone, Debug)]
pub struct Dims {
    pub arch: Arch,
    pub n_layer: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub context: usize,
    pub rms_eps: f64,
    pub rope_theta: f64,
    /// No `output.weight`: the LM head is the embedding matrix.
    pub tied: bool,
}

pub(crate) fn meta<'a>(g: &'a GgufFile, key: &str) -> Result<&'a MetaValue> {
    g.get(key)
        .with_context(|| format!("metadata '{key}' is missing"))
}

pub(crate) fn meta_usize(g: &GgufFile, key: &str) -> Result<usize> {
    let v = meta(g, key)?;
    match v.as_int() {
        Some(i) if i >= 0 && i <= usize::MAX as i128 => Ok(i as usize),
        _ => bail!(
            "metadata '{key}': expected a non-negative integer, found {} {v:?}",
            v.type_name()
        ),
    }
}

pub(crate) fn meta_opt_usize(g: &GgufFile, key: &str) -> Result<Option<usize>> {
    if g.get(key).is_none() {
        return Ok(None);
    }
    meta_usize(g, key).map(Some)
}

/// A float field. A float32 is widened through its shortest decimal form, so that the 1e-5 stored
/// as float32 becomes 1e-5 in config.json (the same f32 again when a model reads it back).
fn meta_f64(g: &GgufFile, key: &str) -> Result<f64> {
    let v = meta(g, key)?;
    if let MetaValue::F32(x) = v {
        return Ok(x
            .to_string()
            .parse()
            .expect("an f32's decimal form parses as f64"));
    }
    v.as_f64().with_context(|| {
        format!(
            "metadata '{key}': expected a number, found {} {v:?}",
            v.type_name()
        )
    })
}

fn nonzero(key: &str, v: usize) -> Result<usize> {
    if v == 0 {
        bail!("metadata '{key}' is 0");
    }
    Ok(v)
}

impl Dims {
    pub fn read(g: &GgufFile) -> Result<Dims> {
        let arch_name = meta(g, "general.architecture")?
            .as_str()
            .context("metadata 'general.architecture' is not a string")?;
        let arch = arch_from_gguf(arch_name)?;
        let k = |s: &str| format!("{arch_name}.{s}");
        let req = |s: &str| meta_usize(g, &k(s)).and_then(|v| nonzero(&k(s), v));
        let n_layer = req("block_count")?;
        let hidden = req("embedding_length")?;
        let intermediate = req("feed_forward_length")?;
        let n_head = req("attention.head_count")?;
        let n_kv_head = match meta_opt_usize(g, &k("attention.head_count_kv"))? {
            Some(v) => nonzero(&k("attention.head_count_kv"), v)?,
            None => n_head,
        };
        if !n_head.is_multiple_of(n_kv_head) {
            bail!("{n_head} attention heads are not a multiple of {n_kv_head} KV heads");
        }
        let head_dim = match meta_opt_usize(g, &k("attention.key_length"))? {
            Some(v) => nonzero(&k("attention.key_length"), v)?,
            None if hidden.is_multiple_of(n_head) => hidden / n_head,
            None => bail!("hidden size {hidden} is not a multiple of {n_head} heads and no attention.key_length is given"),
        };
        if let Some(v) = meta_opt_usize(g, &k("attention.value_length"))? {
            if v != head_dim {
                bail!(
                    "metadata '{}' = {v} differs from the key length {head_dim}",
                    k("attention.value_length")
                );
            }
        }
        if let Some(r) = meta_opt_usize(g, &k("rope.dimension_count"))? {
            if r != head_dim {
                bail!(
                    "partial rotary embeddings ('{}' = {r}, head dim {head_dim}) are not supported",
                    k("rope.dimension_count")
                );
            }
        }
        if let Some(v) = g.get(&k("rope.scaling.type")) {
            if v.as_str() != Some("none") {
                bail!(
                    "rope scaling '{}' = {v:?} is not supported",
                    k("rope.scaling.type")
                );
            }
        }
        let rms_eps = meta_f64(g, &k("attention.layer_norm_rms_epsilon"))?;
        let rope_theta = if g.get(&k("rope.freq_base")).is_some() {
            meta_f64(g, &k("rope.freq_base"))?
        } else {
            10000.0
        };
        let context = req("context_length")?;
        let embd = g
            .tensor("token_embd.weight")
            .context("tensor 'token_embd.weight' is missing")?;
        let vocab = match embd.shape().as_slice() {
            [v, h] if *h == hidden => *v,
            s => bail!("tensor 'token_embd.weight' has shape {s:?}, expected [vocab, {hidden}]"),
        };
        if let Some(v) = meta_opt_usize(g, &k("vocab_size"))? {
            if v != vocab {
                bail!(
                    "metadata '{}' = {v} differs from the embedding's {vocab} rows",
                    k("vocab_size")
                );
            }
        }
        let tied = g.tensor("output.weight").is_none();
        Ok(Dims {
            arch,
            n_layer,
            hidden,
            intermediate,
            n_head,
            n_kv_head,
            head_dim,
            vocab,
            context,
            rms_eps,
            rope_theta,
            tied,
        })
    }

    /// The HF shape every tensor of this model must have, by HF name; `None` for a name the
    /// architecture does not have (e.g. a bias in a Llama file).
    pub fn expected_shape(&self, hf: &str) -> Option<Vec<usize>> {
        let (q, kv, h, f) = (
            self.n_head * self.head_dim,
            self.n_kv_head * self.head_dim,
            self.hidden,
            self.intermediate,
        );
        match hf {
            "model.embed_tokens.weight" => return Some(vec![self.vocab, h]),
            "lm_head.weight" => return Some(vec![self.vocab, h]),
            "model.norm.weight" => return Some(vec![h]),
            _ => {}
        }
        let rest = hf.strip_prefix("model.layers.")?;
        let (layer, part) = rest.split_once('.')?;
        if layer.parse::<usize>().ok()? >= self.n_layer {
            return None;
        }
        let qwen2_bias = self.arch == Arch::Qwen2;
        let qk_norm = self.arch == Arch::Qwen3;
        Some(match part {
            "input_layernorm.weight" | "post_attention_layernorm.weight" => vec![h],
            "self_attn.q_proj.weight" => vec![q, h],
            "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => vec![kv, h],
            "self_attn.o_proj.weight" => vec![h, q],
            "self_attn.q_proj.bias" if qwen2_bias => vec![q],
            "self_attn.k_proj.bias" | "self_attn.v_proj.bias" if qwen2_bias => vec![kv],
            "self_attn.q_norm.weight" | "self_attn.k_norm.weight" if qk_norm => vec![self.head_dim],
            "mlp.gate_proj.weight" | "mlp.up_proj.weight" => vec![f, h],
            "mlp.down_proj.weight" => vec![h, f],
            _ => return None,
        })
    }

    /// Every HF tensor name the model needs.
    pub fn required_names(&self) -> Vec<String> {
        let mut names = vec![
            "model.embed_tokens.weight".to_string(),
            "model.norm.weight".to_string(),
        ];
        if !self.tied {
            names.push("lm_head.weight".into());
        }
        let mut per_layer = vec![
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        ];
        match self.arch {
            Arch::Qwen2 => per_layer.extend([
                "self_attn.q_proj.bias",
                "self_attn.k_proj.bias",
                "self_attn.v_proj.bias",
            ]),
            Arch::Qwen3 => per_layer.extend(["self_attn.q_norm.weight", "self_attn.k_norm.weight"]),
            Arch::Llama => {}
        }
        for l in 0..self.n_layer {
            names.extend(per_layer.iter().map(|p| format!("model.layers.{l}.{p}")));
        }
        names
    }
}

/// Special token ids from `tokenizer.ggml.*_token_id`.
#[derive(Clone, Debug, Default)]
pub struct SpecialIds {
    pub bos: Option<usize>,
    pub eos: Option<usize>,
    /// End-of-turn token when it differs from eos (e.g. Llama-3 `<|eot_id|>`).
    pub eot: Option<usize>,
    pub pad: Option<usize>,
    pub unk: Option<usize>,
}

impl SpecialIds {
    pub fn read(g: &GgufFile, vocab: usize) -> Result<SpecialIds> {
        let id = |name: &str| -> Result<Option<usize>> {
            let key = format!("tokenizer.ggml.{name}_token_id");
            let v = meta_opt_usize(g, &key)?;
            if let Some(i) = v {
                if i >= vocab {
                    bail!("metadata '{key}' = {i} is outside the vocabulary of {vocab}");
                }
            }
            Ok(v)
        };
        let eos = id("eos")?;
        let eot = id("eot")?.filter(|&t| Some(t) != eos);
        Ok(SpecialIds {
            bos: id("bos")?,
            eos,
            eot,
            pad: id("padding")?,
            unk: id("unknown")?,
        })
    }

    /// `eos_token_id` for the generation config: one id, or a list when an end-of-turn id differs.
    fn eos_value(&self) -> Value {
        match (self.eos, self.eot) {
            (Some(e), Some(t)) => json!([e, t]),
            (Some(e), None) => json!(e),
            (None, Some(t)) => json!(t),
            (None, None) => Value::Null,
        }
    }
}

pub fn config_json(d: &Dims, ids: &SpecialIds) -> Value {
    let mut c = json!({
        "architectures": [d.arch.hf_class()],
        "model_type": d.arch.model_type(),
        "hidden_size": d.hidden,
        "intermediate_size": d.intermediate,
        "num_hidden_layers": d.n_layer,
        "num_attention_heads": d.n_head,
        "num_key_value_heads": d.n_kv_head,
        "head_dim": d.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": d.rms_eps,
        "rope_theta": d.rope_theta,
        "rope_scaling": null,
        "max_position_embeddings": d.context,
        "vocab_size": d.vocab,
        "tie_word_embeddings": d.tied,
        "bos_token_id": ids.bos,
        "eos_token_id": ids.eos,
        "torch_dtype": "float32",
        "use_cache": true,
    });
    let extra = match d.arch {
        Arch::Llama => json!({"attention_bias": false, "mlp_bias": false, "pretraining_tp": 1}),
        Arch::Qwen2 => json!({"use_sliding_window": false, "sliding_window": null}),
        Arch::Qwen3 => {
            json!({"attention_bias": false, "use_sliding_window": false, "sliding_window": null})
        }
    };
    if let (Some(c), Value::Object(e)) = (c.as_object_mut(), extra) {
        c.extend(e);
    }
    c
}

pub fn generation_config_json(ids: &SpecialIds) -> Value {
    let mut g = json!({"bos_token_id": ids.bos, "eos_token_id": ids.eos_value()});
    if let Some(p) = ids.pad {
        g["pad_token_id"] = json!(p);
    }
    g
}
