//! `config.json` of a Hugging Face causal LM, reduced to what the decoder needs.
//!
//! Three architectures share one decoder; they differ only in flags read here:
//! - Llama (SmolLM2, Llama-3): optional `attention_bias` on q/k/v/o and `mlp_bias`, optional `rope_scaling`.
//! - Qwen2 / Qwen2.5: bias on q/k/v (never on o), no config flag for it.
//! - Qwen3: per-head RMSNorm on q and k (`q_norm`, `k_norm`) before RoPE, explicit `head_dim`.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;

/// The decoder family, from `architectures` (first entry) or `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
}

impl Arch {
    /// Parse from an `architectures` entry (`Qwen2ForCausalLM`) or a `model_type` (`qwen2`).
    pub fn from_name(name: &str) -> Option<Arch> {
        match name {
            "LlamaForCausalLM" | "llama" => Some(Arch::Llama),
            "Qwen2ForCausalLM" | "qwen2" => Some(Arch::Qwen2),
            "Qwen3ForCausalLM" | "qwen3" => Some(Arch::Qwen3),
            _ => None,
        }
    }

    /// The `architectures` entry transformers writes for this family.
    pub fn hf_class(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    /// The `model_type` transformers writes for this family.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }
}

/// How rotary frequencies are derived from `rope_theta` (transformers' `rope_type`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq[i] = theta^(-2i/d)`.
    Default,
    /// Position interpolation: `inv_freq / factor`.
    Linear { factor: f64 },
    /// Llama-3.1 frequency-dependent scaling.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

/// Everything the decoder reads from `config.json`. `raw` keeps the file as parsed so that saving
/// writes back every field (including ones this crate ignores).
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// Bias on gate/up/down projections.
    pub mlp_bias: bool,
    /// Per-head RMSNorm on q and k (Qwen3).
    pub qk_norm: bool,
    pub max_position_embeddings: Option<i64>,
    pub bos_token_id: Option<i64>,
    /// `eos_token_id` of config.json (an int or a list there).
    pub eos_token_ids: Vec<i64>,
    pub pad_token_id: Option<i64>,
    pub raw: Value,
}

#[derive(Deserialize)]
struct RawConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    vocab_size: i64,
    hidden_size: i64,
    intermediate_size: i64,
    num_hidden_layers: i64,
    num_attention_heads: i64,
    num_key_value_heads: Option<i64>,
    head_dim: Option<i64>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    max_position_embeddings: Option<i64>,
    bos_token_id: Option<Value>,
    eos_token_id: Option<Value>,
    pad_token_id: Option<Value>,
}

/// `eos_token_id`-style field: absent, null, an int, or a list of ints.
pub(crate) fn token_id_list(v: Option<&Value>, field: &str) -> Result<Vec<i64>> {
    match v {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Number(n)) => Ok(vec![n
            .as_i64()
            .with_context(|| format!("{field}: not an integer"))?]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_i64()
                    .with_context(|| format!("{field}: {x} is not an integer"))
            })
            .collect(),
        Some(other) => bail!("{field}: expected an integer or a list of integers, got {other}"),
    }
}

fn first_id(v: Option<&Value>, field: &str) -> Result<Option<i64>> {
    Ok(token_id_list(v, field)?.first().copied())
}

fn num(v: &Value, key: &str, what: &str) -> Result<f64> {
    v.get(key)
        .and_then(Value::as_f64)
        .with_context(|| format!("{what}: missing or non-numeric `{key}`"))
}

impl ModelConfig {
    /// About how many bytes of activations one token keeps for the backward pass, in f32: per
    /// layer, the saved inputs of the two norms, q/k/v/o and the MLP (about ten hidden-size and
    /// two intermediate-size vectors: the MLP's output projection saves only the gate and up
    /// projections, `temper_kernels::swiglu_down`). heaptrack on Qwen2.5-0.5B's GRPO step
    /// (about 975 tokens) measured 2.45 GiB of saved activations when the MLP kept four
    /// intermediate-size vectors, where the formula with four gives 2.48.
    pub fn activation_bytes_per_token(&self) -> u64 {
        let per_layer = 10 * self.hidden_size + 2 * self.intermediate_size;
        (self.num_hidden_layers * per_layer * 4).max(1) as u64
    }

    /// Read and validate `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::from_json_str(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Parse a config from JSON text (see [`ModelConfig::from_file`]).
    pub fn from_json_str(text: &str) -> Result<Self> {
        let raw: Value = serde_json::from_str(text).context("not valid JSON")?;
        Self::from_value(raw)
    }

    /// Parse a config from an already-parsed JSON value.
    pub fn from_value(raw: Value) -> Result<Self> {
        let c: RawConfig =
            serde_json::from_value(raw.clone()).context("unexpected config.json contents")?;
        let arch_name = c
            .architectures
            .as_ref()
            .and_then(|a| a.first().cloned())
            .or(c.model_type.clone())
            .context("neither `architectures` nor `model_type` is set")?;
        let arch = Arch::from_name(&arch_name)
            .or_else(|| c.model_type.as_deref().and_then(Arch::from_name))
            .with_context(|| {
                format!("unknown architecture `{arch_name}` (supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)")
            })?;
        if let Some(act) = &c.hidden_act {
            if act != "silu" {
                bail!("hidden_act `{act}` is not supported (only silu)");
            }
        }
        for (name, v) in [
            ("vocab_size", c.vocab_size),
            ("hidden_size", c.hidden_size),
            ("intermediate_size", c.intermediate_size),
            ("num_hidden_layers", c.num_hidden_layers),
            ("num_attention_heads", c.num_attention_heads),
        ] {
            if v <= 0 {
                bail!("{name} must be positive, got {v}");
            }
        }
        let num_key_value_heads = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
        if num_key_value_heads <= 0 || c.num_attention_heads % num_key_value_heads != 0 {
            bail!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({num_key_value_heads})",
                c.num_attention_heads
            );
        }
        // transformers' defaults: Qwen3Config.head_dim = 128, others hidden / heads.
        let head_dim = match (c.head_dim, arch) {
            (Some(d), _) => d,
            (None, Arch::Qwen3) => 128,
            (None, _) => {
                if c.hidden_size % c.num_attention_heads != 0 {
                    bail!(
                        "hidden_size {} is not a multiple of num_attention_heads {}",
                        c.hidden_size,
                        c.num_attention_heads
                    );
                }
                c.hidden_size / c.num_attention_heads
            }
        };
        if head_dim <= 0 || head_dim % 2 != 0 {
            bail!("head_dim must be positive and even, got {head_dim}");
        }
        // transformers 5 writes `rope_parameters` (with rope_theta inside); older files `rope_theta` +
        // `rope_scaling`.
        let rope_obj = c
            .rope_parameters
            .as_ref()
            .filter(|v| !v.is_null())
            .or(c.rope_scaling.as_ref().filter(|v| !v.is_null()));
        let rope_theta = rope_obj
            .and_then(|v| v.get("rope_theta"))
            .and_then(Value::as_f64)
            .or(c.rope_theta)
            .unwrap_or(10000.0);
        let rope_scaling = match rope_obj {
            None => RopeScaling::Default,
            Some(v) => {
                let ty = v
                    .get("rope_type")
                    .or_else(|| v.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                match ty {
                    "default" => RopeScaling::Default,
                    "linear" => RopeScaling::Linear {
                        factor: num(v, "factor", "rope linear scaling")?,
                    },
                    "llama3" => RopeScaling::Llama3 {
                        factor: num(v, "factor", "rope llama3 scaling")?,
                        low_freq_factor: num(v, "low_freq_factor", "rope llama3 scaling")?,
                        high_freq_factor: num(v, "high_freq_factor", "rope llama3 scaling")?,
                        original_max_position_embeddings: num(
                            v,
                            "original_max_position_embeddings",
                            "rope llama3 scaling",
                        )?,
                    },
                    other => {
                        bail!("rope_type `{other}` is not supported (default, linear, llama3)")
                    }
                }
            }
        };
        let attention_bias = c.attention_bias.unwrap_or(false);
        let (qkv_bias, o_bias) = match arch {
            Arch::Qwen2 => (true, false),
            Arch::Llama | Arch::Qwen3 => (attention_bias, attention_bias),
        };
        let mlp_bias = arch == Arch::Llama && c.mlp_bias.unwrap_or(false);
        Ok(ModelConfig {
            arch,
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_hidden_layers: c.num_hidden_layers,
            num_attention_heads: c.num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: c.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            // LlamaConfig, Qwen2Config and Qwen3Config all default to untied.
            tie_word_embeddings: c.tie_word_embeddings.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias,
            qk_norm: arch == Arch::Qwen3,
            max_position_embeddings: c.max_position_embeddings,
            bos_token_id: first_id(c.bos_token_id.as_ref(), "bos_token_id")?,
            eos_token_ids: token_id_list(c.eos_token_id.as_ref(), "eos_token_id")?,
            pad_token_id: first_id(c.pad_token_id.as_ref(), "pad_token_id")?,
            raw,
        })
    }

    /// A Qwen2-shaped config from its sizes (for tests and benches), with `raw` filled in so it can be
    /// saved and read by transformers.
    #[allow(clippy::too_many_arguments)]
    pub fn qwen2_like(
        vocab_size: i64,
        hidden_size: i64,
        intermediate_size: i64,
        num_hidden_layers: i64,
        num_attention_heads: i64,
        num_key_value_heads: i64,
        tie_word_embeddings: bool,
    ) -> Self {
        let raw = serde_json::json!({
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": vocab_size,
            "hidden_size": hidden_size,
            "intermediate_size": intermediate_size,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": num_attention_heads,
            "num_key_value_heads": num_key_value_heads,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": tie_word_embeddings,
            "use_sliding_window": false,
        });
        Self::from_value(raw).expect("qwen2_like builds a valid config")
    }

    /// Number of parameters (counting a tied head once).
    pub fn num_params(&self) -> i64 {
        let h = self.hidden_size;
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let mut attn = h * q + 2 * h * kv + q * h;
        if self.qkv_bias {
            attn += q + 2 * kv;
        }
        if self.o_bias {
            attn += h;
        }
        if self.qk_norm {
            attn += 2 * self.head_dim;
        }
        let mut mlp = 3 * h * self.intermediate_size;
        if self.mlp_bias {
            mlp += 2 * self.intermediate_size + h;
        }
        let layer = attn + mlp + 2 * h;
        let emb = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { emb };
        emb + head + h + self.num_hidden_layers * layer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<ModelConfig> {
        ModelConfig::from_value(v)
    }

    fn base(arch: &str) -> Value {
        serde_json::json!({
            "architectures": [arch], "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2
        })
    }

    #[test]
    fn defaults_follow_transformers() {
        let c = parse(base("Qwen3ForCausalLM")).unwrap();
        assert_eq!(
            (c.arch, c.head_dim, c.num_key_value_heads),
            (Arch::Qwen3, 128, 2)
        );
        assert!(c.qk_norm && !c.qkv_bias && !c.tie_word_embeddings);
        assert_eq!((c.rope_theta, c.rms_norm_eps), (10000.0, 1e-6));
        let c = parse(base("Qwen2ForCausalLM")).unwrap();
        assert_eq!(c.head_dim, 4);
        assert!(c.qkv_bias && !c.o_bias && !c.qk_norm && !c.mlp_bias);
        let mut v = base("LlamaForCausalLM");
        v["attention_bias"] = true.into();
        v["mlp_bias"] = true.into();
        let c = parse(v).unwrap();
        assert!(c.qkv_bias && c.o_bias && c.mlp_bias);
    }

    #[test]
    fn model_type_when_architectures_is_missing() {
        let mut v = base("x");
        v.as_object_mut().unwrap().remove("architectures");
        v["model_type"] = "qwen2".into();
        assert_eq!(parse(v).unwrap().arch, Arch::Qwen2);
    }

    #[test]
    fn rope_old_and_new_layouts() {
        let mut v = base("LlamaForCausalLM");
        v["rope_theta"] = 500000.0.into();
        v["rope_scaling"] = serde_json::json!({"type": "linear", "factor": 2.0});
        let c = parse(v).unwrap();
        assert_eq!(
            (c.rope_theta, c.rope_scaling),
            (500000.0, RopeScaling::Linear { factor: 2.0 })
        );
        let mut v = base("Qwen2ForCausalLM");
        v["rope_theta"] = 1e6.into();
        v["rope_scaling"] = Value::Null;
        assert_eq!(parse(v).unwrap().rope_theta, 1e6);
        let mut v = base("LlamaForCausalLM");
        v["rope_parameters"] = serde_json::json!({"rope_type": "default", "rope_theta": 123.0});
        assert_eq!(parse(v).unwrap().rope_theta, 123.0);
    }

    #[test]
    fn eos_int_or_list() {
        let mut v = base("LlamaForCausalLM");
        v["eos_token_id"] = serde_json::json!([5, 6]);
        v["bos_token_id"] = 1.into();
        let c = parse(v).unwrap();
        assert_eq!(
            (c.eos_token_ids, c.bos_token_id, c.pad_token_id),
            (vec![5, 6], Some(1), None)
        );
        let mut v = base("LlamaForCausalLM");
        v["eos_token_id"] = 7.into();
        assert_eq!(parse(v).unwrap().eos_token_ids, vec![7]);
    }

    #[test]
    fn errors_name_the_problem() {
        let err = |v: Value| format!("{:#}", parse(v).unwrap_err());
        assert!(err(base("GPT2LMHeadModel")).contains("unknown architecture `GPT2LMHeadModel`"));
        let mut v = base("LlamaForCausalLM");
        v["hidden_act"] = "gelu".into();
        assert!(err(v).contains("hidden_act `gelu`"));
        let mut v = base("LlamaForCausalLM");
        v["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
        assert!(err(v).contains("rope_type `yarn`"));
        let mut v = base("LlamaForCausalLM");
        v["num_key_value_heads"] = 3.into();
        assert!(err(v).contains("num_key_value_heads"));
        let mut v = base("LlamaForCausalLM");
        v.as_object_mut().unwrap().remove("hidden_size");
        assert!(err(v).contains("hidden_size"));
        let mut v = base("LlamaForCausalLM");
        v["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
        assert!(err(v).contains("low_freq_factor"));
    }

    #[test]
    fn num_params_counts_like_transformers() {
        // transformers: Qwen2(vocab 32000, hidden 384, inter 1024, 6 layers, 6/2 heads, tied) has
        // 21,734,016 parameters (tools/bench_train.py prints it).
        let c = ModelConfig::qwen2_like(32000, 384, 1024, 6, 6, 2, true);
        assert_eq!(c.num_params(), 21_734_016);
    }
}
