//! The decoder: one forward for Llama, Qwen2 and Qwen3, used by training (autograd, no cache) and
//! by sampling (`tch::no_grad`, with a [`KvCache`]).

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use anyhow::Result;
use tch::{nn, Device, Kind, Tensor};

use crate::config::ModelConfig;
use crate::kv_cache::KvCache;
use crate::logprobs::logprobs_and_entropy;
use crate::rope::{apply_rope, Rope};

/// The dtype matmuls and attention run in. Weights are always f32 master copies; with `Bf16` they
/// are cast to bf16 at each use (tch has no CPU autocast), activations entering a matmul or attention
/// are bf16, while the residual stream, the norms and the returned logits stay f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeKind {
    F32,
    Bf16,
}

impl ComputeKind {
    pub fn kind(self) -> Kind {
        match self {
            ComputeKind::F32 => Kind::Float,
            ComputeKind::Bf16 => Kind::BFloat16,
        }
    }
}

impl std::str::FromStr for ComputeKind {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" | "float32" | "fp32" => Ok(ComputeKind::F32),
            "bf16" | "bfloat16" => Ok(ComputeKind::Bf16),
            other => anyhow::bail!("unknown compute dtype `{other}` (f32 or bf16)"),
        }
    }
}

impl std::fmt::Display for ComputeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ComputeKind::F32 => "f32",
            ComputeKind::Bf16 => "bf16",
        })
    }
}

#[derive(Debug)]
struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    /// Weight and bias already cast to the compute dtype (see [`CausalLm::with_cached_compute_weights`]).
    cast: RefCell<Option<(Tensor, Option<Tensor>)>>,
}

impl Linear {
    fn new(p: nn::Path, in_dim: i64, out_dim: i64, bias: bool, init: nn::Init) -> Self {
        let weight = p.var("weight", &[out_dim, in_dim], init);
        let bias = bias.then(|| p.var("bias", &[out_dim], init));
        Linear {
            weight,
            bias,
            cast: RefCell::new(None),
        }
    }

    /// `x @ W^T + b` with W (and b) cast to `kind`, the dtype of `x`.
    fn forward(&self, x: &Tensor, kind: Kind) -> Tensor {
        if kind == Kind::Float {
            return x.linear(&self.weight, self.bias.as_ref());
        }
        if let Some((w, b)) = self
            .cast
            .borrow()
            .as_ref()
            .filter(|(w, _)| w.kind() == kind)
        {
            return x.linear(w, b.as_ref());
        }
        x.linear(
            &self.weight.to_kind(kind),
            self.bias.as_ref().map(|b| b.to_kind(kind)),
        )
    }

    fn cache_cast(&self, kind: Kind) {
        let cast = (
            self.weight.detach().to_kind(kind),
            self.bias.as_ref().map(|b| b.detach().to_kind(kind)),
        );
        *self.cast.borrow_mut() = Some(cast);
    }

    fn drop_cast(&self) {
        *self.cast.borrow_mut() = None;
    }
}

/// RMSNorm in f32 whatever the input dtype; returns f32.
fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let d = x.size()[x.dim() - 1];
    x.to_kind(Kind::Float).rms_norm([d], Some(weight), eps)
}

#[derive(Debug)]
struct Layer {
    input_layernorm: Tensor,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    post_attention_layernorm: Tensor,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

/// A causal language model: f32 master weights in a [`nn::VarStore`] whose variable names are the
/// Hugging Face parameter names (`model.layers.0.self_attn.q_proj.weight`, ...).
#[derive(Debug)]
pub struct CausalLm {
    config: ModelConfig,
    vs: nn::VarStore,
    embed_tokens: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    /// None when tied to `embed_tokens`.
    lm_head: Option<Tensor>,
    /// The head weight cast to the compute dtype, while weights are cached.
    head_cast: RefCell<Option<Tensor>>,
    rope: Rope,
    compute: ComputeKind,
    source_dir: Option<PathBuf>,
}

impl CausalLm {
    /// Allocate every parameter with `init` for matrices and embeddings (norm weights start at one).
    pub(crate) fn build(
        config: ModelConfig,
        device: Device,
        compute: ComputeKind,
        init: nn::Init,
    ) -> Self {
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let c = &config;
        let h = c.hidden_size;
        let q_dim = c.num_attention_heads * c.head_dim;
        let kv_dim = c.num_key_value_heads * c.head_dim;
        let norm_init = nn::Init::Const(1.0);
        let model = &root / "model";
        let embed_tokens = (&model / "embed_tokens").var("weight", &[c.vocab_size, h], init);
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let l = &model / "layers" / i;
                let attn = &l / "self_attn";
                let mlp = &l / "mlp";
                Layer {
                    input_layernorm: (&l / "input_layernorm").var("weight", &[h], norm_init),
                    q_proj: Linear::new(&attn / "q_proj", h, q_dim, c.qkv_bias, init),
                    k_proj: Linear::new(&attn / "k_proj", h, kv_dim, c.qkv_bias, init),
                    v_proj: Linear::new(&attn / "v_proj", h, kv_dim, c.qkv_bias, init),
                    o_proj: Linear::new(&attn / "o_proj", q_dim, h, c.o_bias, init),
                    q_norm: c
                        .qk_norm
                        .then(|| (&attn / "q_norm").var("weight", &[c.head_dim], norm_init)),
                    k_norm: c
                        .qk_norm
                        .then(|| (&attn / "k_norm").var("weight", &[c.head_dim], norm_init)),
                    post_attention_layernorm: (&l / "post_attention_layernorm").var(
                        "weight",
                        &[h],
                        norm_init,
                    ),
                    gate_proj: Linear::new(
                        &mlp / "gate_proj",
                        h,
                        c.intermediate_size,
                        c.mlp_bias,
                        init,
                    ),
                    up_proj: Linear::new(
                        &mlp / "up_proj",
                        h,
                        c.intermediate_size,
                        c.mlp_bias,
                        init,
                    ),
                    down_proj: Linear::new(
                        &mlp / "down_proj",
                        c.intermediate_size,
                        h,
                        c.mlp_bias,
                        init,
                    ),
                }
            })
            .collect();
        let norm = (&model / "norm").var("weight", &[h], norm_init);
        let lm_head = (!c.tie_word_embeddings)
            .then(|| (&root / "lm_head").var("weight", &[c.vocab_size, h], init));
        let rope = Rope::new(&config, device);
        CausalLm {
            config,
            vs,
            embed_tokens,
            layers,
            norm,
            lm_head,
            head_cast: RefCell::new(None),
            rope,
            compute,
            source_dir: None,
        }
    }

    /// A model with random weights (normal, std 0.02; norms at one), reproducible from `seed`.
    /// Note: seeds libtorch's global generator.
    pub fn random(config: ModelConfig, seed: u64, device: Device, compute: ComputeKind) -> Self {
        tch::manual_seed(seed as i64);
        Self::build(
            config,
            device,
            compute,
            nn::Init::Randn {
                mean: 0.0,
                stdev: 0.02,
            },
        )
    }

    /// Load a Hugging Face folder (config.json + model.safetensors or a sharded index).
    pub fn load(dir: &Path, device: Device, compute: ComputeKind) -> Result<Self> {
        crate::load::load_folder(dir, device, compute)
    }

    pub(crate) fn set_source_dir(&mut self, dir: PathBuf) {
        self.source_dir = Some(dir);
    }

    /// The folder the model was loaded from (tokenizer files are copied from there on save).
    pub fn source_dir(&self) -> Option<&Path> {
        self.source_dir.as_deref()
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn device(&self) -> Device {
        self.vs.device()
    }

    pub fn compute(&self) -> ComputeKind {
        self.compute
    }

    pub fn set_compute(&mut self, compute: ComputeKind) {
        self.compute = compute;
    }

    /// The f32 master weights; variable names are HF parameter names.
    pub fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    pub fn var_store_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }

    /// `(HF name, tensor)` for every parameter, sorted by name (tensors share storage with the model).
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<_> = self.vs.variables().into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// An empty cache for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.layers.len())
    }

    /// Logits (B, T, V) in f32. See [`CausalLm::forward_hidden`] for the arguments.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        self.logits(&self.forward_hidden(input_ids, position_ids, attention_mask, cache))
    }

    /// Final hidden states (B, T, hidden) after the last norm, f32.
    ///
    /// - `input_ids`: (B, T) i64, the new tokens (after any cached ones).
    /// - `position_ids`: (B, T) i64, each token's position in its own row (for left padding:
    ///   `cumsum(mask) - 1`; any value for pad tokens).
    /// - `attention_mask`: (B, S_past + T), 1 for real tokens and 0 for padding, covering cached and
    ///   new positions.
    /// - `cache`: appended to (and advanced by T) when given.
    ///
    /// A query attends to keys that are at or before it and real; it also always attends to itself,
    /// so a pad query never has an empty softmax (its output is meaningless but finite, and no real
    /// token attends to it). Hence a padded row gives the same numbers as the row alone.
    // `h = h + x`, not `h += x`: tch's `+=` is in place, which would clobber tensors autograd saved.
    #[allow(clippy::assign_op_pattern)]
    pub fn forward_hidden(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        mut cache: Option<&mut KvCache>,
    ) -> Tensor {
        let kind = self.compute.kind();
        let c = &self.config;
        let (b, t) = input_ids.size2().expect("input_ids must be (B, T)");
        let past = cache.as_ref().map_or(0, |c| c.len());
        assert_eq!(
            attention_mask.size(),
            [b, past + t],
            "attention_mask must be (B, S_past + T) = ({b}, {})",
            past + t
        );
        assert_eq!(position_ids.size(), [b, t], "position_ids must be (B, T)");
        let mask = attention_mask_4d(attention_mask, t, past);
        let (cos, sin) = self.rope.cos_sin(position_ids, kind);
        let mut h = Tensor::embedding(&self.embed_tokens, input_ids, -1, false, false);
        for (i, layer) in self.layers.iter().enumerate() {
            let x = rms_norm(&h, &layer.input_layernorm, c.rms_norm_eps).to_kind(kind);
            let q = layer
                .q_proj
                .forward(&x, kind)
                .view([b, t, c.num_attention_heads, c.head_dim]);
            let k = layer
                .k_proj
                .forward(&x, kind)
                .view([b, t, c.num_key_value_heads, c.head_dim]);
            let v = layer
                .v_proj
                .forward(&x, kind)
                .view([b, t, c.num_key_value_heads, c.head_dim]);
            let (q, k) = match (&layer.q_norm, &layer.k_norm) {
                (Some(qn), Some(kn)) => (
                    rms_norm(&q, qn, c.rms_norm_eps).to_kind(kind),
                    rms_norm(&k, kn, c.rms_norm_eps).to_kind(kind),
                ),
                _ => (q, k),
            };
            let q = apply_rope(&q.transpose(1, 2), &cos, &sin);
            let k = apply_rope(&k.transpose(1, 2), &cos, &sin);
            let v = v.transpose(1, 2);
            let (k, v) = match cache.as_deref_mut() {
                Some(cache) => cache.append(i, &k, &v),
                None => (k, v),
            };
            let attn = Tensor::scaled_dot_product_attention(
                &q,
                &k,
                &v,
                Some(&mask),
                0.0,
                false,
                None,
                true,
            );
            let attn = attn
                .transpose(1, 2)
                .reshape([b, t, c.num_attention_heads * c.head_dim]);
            h = h + layer.o_proj.forward(&attn, kind);
            let x = rms_norm(&h, &layer.post_attention_layernorm, c.rms_norm_eps).to_kind(kind);
            let gate = layer.gate_proj.forward(&x, kind).silu();
            let up = layer.up_proj.forward(&x, kind);
            h = h + layer.down_proj.forward(&(gate * up), kind);
        }
        if let Some(cache) = cache {
            cache.advance(t);
        }
        rms_norm(&h, &self.norm, c.rms_norm_eps)
    }

    /// Run `f` with every matrix cast to the compute dtype once, instead of at each forward: with
    /// bf16 compute, a decode step then reads 2 bytes per weight instead of casting 4 into 2. The
    /// numbers are bitwise those of the uncached path. For sampling, under `tch::no_grad`: the
    /// cached copies are detached (no gradient reaches the master weights through them) and must
    /// not outlive a weight update, which is why they only live for the duration of `f`.
    /// With f32 compute this just calls `f`.
    pub fn with_cached_compute_weights<T>(&self, f: impl FnOnce() -> T) -> T {
        let kind = self.compute.kind();
        if kind == Kind::Float {
            return f();
        }
        struct Thaw<'a>(&'a CausalLm);
        impl Drop for Thaw<'_> {
            fn drop(&mut self) {
                self.0.for_each_linear(Linear::drop_cast);
                *self.0.head_cast.borrow_mut() = None;
            }
        }
        self.for_each_linear(|l| l.cache_cast(kind));
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        *self.head_cast.borrow_mut() = Some(head.detach().to_kind(kind));
        let _thaw = Thaw(self);
        f()
    }

    fn for_each_linear(&self, f: impl Fn(&Linear)) {
        for l in &self.layers {
            for lin in [
                &l.q_proj,
                &l.k_proj,
                &l.v_proj,
                &l.o_proj,
                &l.gate_proj,
                &l.up_proj,
                &l.down_proj,
            ] {
                f(lin);
            }
        }
    }

    /// Logits (..., V) in f32 from final hidden states (e.g. only the last position when sampling).
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        let kind = self.compute.kind();
        let w = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        let x = hidden.to_kind(kind);
        // `linear`, not `matmul(w.tr())`: the latter's backward was ~25% slower here.
        let cached = self.head_cast.borrow();
        let logits = match cached.as_ref().filter(|c| c.kind() == kind) {
            _ if kind == Kind::Float => x.linear(w, None::<&Tensor>),
            Some(c) => x.linear(c, None::<&Tensor>),
            None => x.linear(&w.to_kind(kind), None::<&Tensor>),
        };
        logits.to_kind(Kind::Float)
    }

    /// Per-token log-probabilities of `targets` (B, T) under softmax(logits / temperature), and the
    /// entropy of that distribution, both (B, T) f32 with autograd. Usually `targets` is `input_ids`
    /// shifted left by one (the caller masks the last position and padding).
    pub fn token_logprobs(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        position_ids: &Tensor,
        targets: &Tensor,
        temperature: f64,
    ) -> (Tensor, Tensor) {
        let logits = self.forward(input_ids, position_ids, attention_mask, None);
        logprobs_and_entropy(&logits, targets, temperature)
    }

    /// [`CausalLm::token_logprobs`] without autograd (old / reference logprobs), computing the head
    /// and the softmax over at most `chunk_rows` positions at a time, so memory holds a few
    /// (chunk_rows, V) tensors instead of several (B, T, V) ones (V can be 150k).
    pub fn token_logprobs_no_grad(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        position_ids: &Tensor,
        targets: &Tensor,
        temperature: f64,
        chunk_rows: i64,
    ) -> (Tensor, Tensor) {
        tch::no_grad(|| {
            let hidden = self.forward_hidden(input_ids, position_ids, attention_mask, None);
            let (b, t, h) = hidden.size3().expect("hidden is (B, T, H)");
            let flat = hidden.reshape([b * t, h]);
            let flat_targets = targets.reshape([b * t]);
            let step = chunk_rows.max(1);
            let (mut lps, mut ents) = (vec![], vec![]);
            for start in (0..b * t).step_by(step as usize) {
                let n = step.min(b * t - start);
                let logits = self.logits(&flat.narrow(0, start, n));
                let (lp, ent) =
                    logprobs_and_entropy(&logits, &flat_targets.narrow(0, start, n), temperature);
                lps.push(lp);
                ents.push(ent);
            }
            (
                Tensor::cat(&lps, 0).view([b, t]),
                Tensor::cat(&ents, 0).view([b, t]),
            )
        })
    }
}

/// Boolean (B, 1, T, S) mask, true where query i (at absolute position past+i) may attend key j:
/// `j <= past + i && (key j is real || j == past + i)`.
pub fn attention_mask_4d(attention_mask: &Tensor, t: i64, past: i64) -> Tensor {
    let (b, s) = attention_mask.size2().expect("attention_mask must be 2-D");
    let dev = attention_mask.device();
    let q_pos = Tensor::arange_start(past, past + t, (Kind::Int64, dev)).view([t, 1]);
    let k_pos = Tensor::arange(s, (Kind::Int64, dev)).view([1, s]);
    let causal = k_pos.le_tensor(&q_pos).view([1, 1, t, s]);
    let own = k_pos.eq_tensor(&q_pos).view([1, 1, t, s]);
    let real = attention_mask.ne(0).view([b, 1, 1, s]);
    causal.logical_and(&real).logical_or(&own)
}

/// Position ids (B, T) for a 0/1 mask (B, T): `cumsum(mask) - 1`, clamped at 0 on left padding.
pub fn position_ids_from_mask(attention_mask: &Tensor) -> Tensor {
    (attention_mask.to_kind(Kind::Int64).cumsum(1, Kind::Int64) - 1).clamp_min(0)
}
