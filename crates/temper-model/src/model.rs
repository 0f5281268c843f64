//! The decoder: one forward for Llama, Qwen2 and Qwen3, used by training (autograd, no cache) and
//! by sampling (`tch::no_grad`, with a [`KvCache`]).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use tch::{nn, Device, Kind, Tensor};

use crate::attention::{attend_cached, attend_fixed, attention_mask_4d, sdpa};
use crate::config::ModelConfig;
use crate::dtype::ComputeKind;
use crate::kv_cache::KvCache;
use crate::lora::{LoraAdapter, LoraConfig};
use crate::rope::{apply_rope, Rope};
use crate::sampling_weights::SamplingWeights;
use crate::shared_base::SharedBase;
use crate::static_decode::{StaticDecoder, StaticKv};

mod activation_checkpoint;
mod layer;
mod logits;
mod lora_parts;
pub(crate) use lora_parts::Part;
mod sampling;
mod static_step;

pub use activation_checkpoint::LayerCheckpoints;
pub(crate) use activation_checkpoint::Segment;
use layer::{rms_norm, Layer, Linear};

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
    /// Fused, compute-dtype copies of the matmul weights while a sampling call runs
    /// ([`CausalLm::with_sampling_weights`]).
    sampling: RefCell<Option<SamplingWeights>>,
    /// On CUDA, the sampling copies of the last call, refreshed in place by the next one so
    /// that captured decode steps, which read their addresses, stay valid.
    kept_sampling: RefCell<Option<SamplingWeights>>,
    /// The fixed-shape decode step and its cache ([`crate::static_decode`]), kept across
    /// sampling calls (its CUDA graphs with it).
    static_decoder: RefCell<Option<StaticDecoder>>,
    rope: Rope,
    compute: ComputeKind,
    source_dir: Option<PathBuf>,
    /// LoRA adapters: their config and their own variables (the base `vs` stays the HF weights).
    lora: Option<(LoraConfig, nn::VarStore)>,
    /// LoRA on the unembedding (`lm_head` target, Tinker's `train_unembed`); with tied
    /// embeddings it adapts the output projection only.
    head_lora: Option<LoraAdapter>,
    /// The frozen base whose tensors this model's base parameters are (shared, not copied), for
    /// a LoRA model built by [`SharedBase::lora_model`]; held so the base stays registered.
    shared_base: Option<SharedBase>,
    /// Whether a backward through this model trims malloc's heap as it leaves each decoder layer
    /// ([`CausalLm::set_trim_heap_in_backward`]).
    trim_heap: Cell<bool>,
    /// Where the decoder layers' weights come from when they are not always whole (sharded
    /// training, [`crate::residency`]).
    pub(crate) residency: RefCell<Option<std::sync::Arc<dyn crate::LayerResidency>>>,
}

/// Models of at least this many parameters trim the heap during the backward by default: on
/// Qwen2.5-0.5B's GRPO step it lowered the peak by 1.3 GiB at no measurable cost; on SmolLM2-135M
/// it saved 0.3 GB but cost 5-10% of the update (the trimmed pages fault in again, and a small
/// model's layers compute too little to hide that). BENCHMARKS.md, "The MLP's saved activations,
/// and trimming the heap in the backward".
pub const TRIM_HEAP_MIN_PARAMS: i64 = 300_000_000;

/// Where [`CausalLm::build`] gets each parameter.
pub(crate) enum Params<'a> {
    /// New tensors: matrices, embeddings and biases with this initializer, norm weights at one.
    Fresh(nn::Init),
    /// The tensors of a frozen base of the same config, by HF name: shared, not copied, and not
    /// trainable in the new model.
    Shared(&'a HashMap<String, Tensor>),
}

impl Params<'_> {
    fn matrix(&self, p: &nn::Path, name: &str, dims: &[i64]) -> Tensor {
        match self {
            Params::Fresh(init) => p.var(name, dims, *init),
            Params::Shared(tensors) => Self::share(tensors, p, name),
        }
    }

    fn norm(&self, p: &nn::Path, dims: &[i64]) -> Tensor {
        match self {
            Params::Fresh(_) => p.var("weight", dims, nn::Init::Const(1.0)),
            Params::Shared(tensors) => Self::share(tensors, p, "weight"),
        }
    }

    fn share(tensors: &HashMap<String, Tensor>, p: &nn::Path, name: &str) -> Tensor {
        // The base was built from the same config, so it has every name this build asks for.
        let t = &tensors[&p.path(name)];
        p.add(name, t.shallow_clone(), false)
    }
}

impl CausalLm {
    /// Allocate every parameter with `init` for matrices and embeddings (norm weights start at one).
    pub(crate) fn build(
        config: ModelConfig,
        device: Device,
        compute: ComputeKind,
        params: &Params,
    ) -> Self {
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let c = &config;
        let h = c.hidden_size;
        let q_dim = c.num_attention_heads * c.head_dim;
        let kv_dim = c.num_key_value_heads * c.head_dim;
        let model = &root / "model";
        let embed_tokens = params.matrix(&(&model / "embed_tokens"), "weight", &[c.vocab_size, h]);
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let l = &model / "layers" / i;
                let attn = &l / "self_attn";
                let mlp = &l / "mlp";
                Layer {
                    input_layernorm: params.norm(&(&l / "input_layernorm"), &[h]),
                    q_proj: Linear::new(&attn / "q_proj", h, q_dim, c.qkv_bias, params),
                    k_proj: Linear::new(&attn / "k_proj", h, kv_dim, c.qkv_bias, params),
                    v_proj: Linear::new(&attn / "v_proj", h, kv_dim, c.qkv_bias, params),
                    o_proj: Linear::new(&attn / "o_proj", q_dim, h, c.o_bias, params),
                    q_norm: c
                        .qk_norm
                        .then(|| params.norm(&(&attn / "q_norm"), &[c.head_dim])),
                    k_norm: c
                        .qk_norm
                        .then(|| params.norm(&(&attn / "k_norm"), &[c.head_dim])),
                    post_attention_layernorm: params.norm(&(&l / "post_attention_layernorm"), &[h]),
                    gate_proj: Linear::new(
                        &mlp / "gate_proj",
                        h,
                        c.intermediate_size,
                        c.mlp_bias,
                        params,
                    ),
                    up_proj: Linear::new(
                        &mlp / "up_proj",
                        h,
                        c.intermediate_size,
                        c.mlp_bias,
                        params,
                    ),
                    down_proj: Linear::new(
                        &mlp / "down_proj",
                        c.intermediate_size,
                        h,
                        c.mlp_bias,
                        params,
                    ),
                }
            })
            .collect();
        let norm = params.norm(&(&model / "norm"), &[h]);
        let lm_head = (!c.tie_word_embeddings)
            .then(|| params.matrix(&(&root / "lm_head"), "weight", &[c.vocab_size, h]));
        let rope = Rope::new(&config, device);
        // Activations live in malloc's heap on CPU only.
        let trim_heap = device == Device::Cpu && config.num_params() >= TRIM_HEAP_MIN_PARAMS;
        CausalLm {
            config,
            vs,
            embed_tokens,
            layers,
            norm,
            lm_head,
            sampling: RefCell::new(None),
            kept_sampling: RefCell::new(None),
            static_decoder: RefCell::new(None),
            rope,
            compute,
            source_dir: None,
            lora: None,
            head_lora: None,
            shared_base: None,
            trim_heap: Cell::new(trim_heap),
            residency: RefCell::new(None),
        }
    }

    /// Whether a backward through this model hands the free pages of malloc's heap back to the
    /// kernel as it leaves each decoder layer, once 256 MiB have gathered
    /// ([`temper_kernels::memory::release_free_memory_if_grown`]): the backward frees each
    /// layer's saved activations while it allocates the layer's gradients, which do not fit
    /// their holes, so without it the heap grows around resident free memory. Less peak memory
    /// for some time (page faults). Default: on for models of [`TRIM_HEAP_MIN_PARAMS`] or more on
    /// the CPU.
    /// The numbers computed do not change.
    pub fn set_trim_heap_in_backward(&self, on: bool) {
        self.trim_heap.set(on);
    }

    pub fn trims_heap_in_backward(&self) -> bool {
        self.trim_heap.get()
    }

    /// A model with random weights (normal, std 0.02; norms at one), reproducible from `seed`.
    /// Note: seeds libtorch's global generator (under [`crate::seeded::with_seed`]).
    pub fn random(config: ModelConfig, seed: u64, device: Device, compute: ComputeKind) -> Self {
        crate::seeded::with_seed(seed, || {
            Self::build(
                config,
                device,
                compute,
                &Params::Fresh(nn::Init::Randn {
                    mean: 0.0,
                    stdev: 0.02,
                }),
            )
        })
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

    /// The master weights, to write (load a checkpoint into). Refused for a model that
    /// [`CausalLm::shares_base`]: its base variables are other models' too.
    pub fn var_store_mut(&mut self) -> Result<&mut nn::VarStore> {
        if self.shared_base.is_some() {
            anyhow::bail!("this model's base weights are shared with other LoRA models: they cannot be written");
        }
        Ok(&mut self.vs)
    }

    pub(crate) fn freeze_base(&mut self) {
        self.vs.freeze();
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
    pub fn forward_hidden(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        let kv = match cache {
            Some(c) => PastKv::Cache(c),
            None => PastKv::None,
        };
        self.forward_layers(
            input_ids,
            position_ids,
            Mask::Padding(attention_mask),
            kv,
            false,
        )
        .0
    }

    /// The layers of [`CausalLm::forward_hidden`], with earlier positions' keys and values from
    /// `kv`. With `collect`, also returns each layer's keys and values of the new tokens
    /// ((B, Hkv, T, d) after RoPE, in the compute dtype, with autograd) for a later
    /// [`PastKv::Given`] (shared-prefix training, [`crate::shared_prefix`]).
    pub(crate) fn forward_layers(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: Mask<'_>,
        kv: PastKv<'_>,
        collect: bool,
    ) -> (Tensor, Vec<(Tensor, Tensor)>) {
        let kind = self.compute.kind();
        let (b, t) = input_ids.size2().expect("input_ids must be (B, T)");
        let (mut cache, given) = match kv {
            PastKv::None => (None, None),
            PastKv::Cache(c) => (Some(c), None),
            PastKv::Given(g) => (None, Some(g)),
        };
        let past = match (&cache, given) {
            (Some(c), _) => c.len(),
            (None, Some(g)) => g.first().map_or(0, |(k, _)| k.size()[2]),
            (None, None) => 0,
        };
        let mut collected = Vec::new();
        assert_eq!(position_ids.size(), [b, t], "position_ids must be (B, T)");
        let mask = attention_mask.to_4d(b, t, past);
        // With a cache on CPU, attention runs in f32 over the cache (see `attend_cached`).
        let cached_attention = cache.is_some() && self.device() == Device::Cpu;
        // The one-token decode path takes the mask as a (B, S) additive bias, built once.
        let decode_bias = (cached_attention && t == 1).then(|| {
            Tensor::zeros([b, past + t], (Kind::Float, mask.device()))
                .masked_fill(&mask.view([b, past + t]).logical_not(), f64::NEG_INFINITY)
        });
        let (cos, sin) = self.rope.cos_sin(position_ids, kind);
        let ctx = LayerContext {
            b,
            t,
            cos: &cos,
            sin: &sin,
            mask: &mask,
            decode_bias: decode_bias.as_ref(),
            cached_attention,
            fixed: None,
        };
        let sampling = self.sampling.borrow();
        let sparse = self.sparse_embedding_grad();
        let mut h = self.embed(input_ids, sparse);
        for i in 0..self.layers.len() {
            let frozen = sampling.as_ref().map(|s| &s.layers[i]);
            let collect_into = collect.then_some(&mut collected);
            let past = given.map(|g| &g[i]);
            // With sampling copies the layer's matrices are not read (its vectors are always
            // whole): nothing to gather, and a rank's decode steps need not match another's.
            if frozen.is_none() {
                self.fetch_layer(i);
            }
            h = self.layer(i, h, &ctx, frozen, cache.as_deref_mut(), past, collect_into);
            if frozen.is_none() {
                self.release_layer_after_forward(i);
            }
            if self.trims_heap_in_backward() {
                // The backward leaves this layer here.
                temper_kernels::memory::release_free_memory_on_grad(&h);
            }
        }
        if let Some(cache) = cache {
            cache.advance(t);
        }
        (self.final_norm(&h), collected)
    }

    /// Decoder layer `i` on the residual stream `h` (B, T, hidden): attention (over the
    /// `cache`'s earlier keys and values, the given `past` ones of this layer, or none), then the
    /// MLP; with `collected`, also keeps the layer's keys and values of the new tokens.
    // `h = h + x`, not `h += x`: tch's `+=` is in place, which would clobber tensors autograd saved.
    #[allow(clippy::assign_op_pattern, clippy::too_many_arguments)]
    fn layer(
        &self,
        i: usize,
        mut h: Tensor,
        ctx: &LayerContext<'_>,
        frozen: Option<&crate::sampling_weights::FrozenLayer>,
        cache: Option<&mut KvCache>,
        past: Option<&(Tensor, Tensor)>,
        collected: Option<&mut Vec<(Tensor, Tensor)>>,
    ) -> Tensor {
        let kind = self.compute.kind();
        let c = &self.config;
        let (b, t) = (ctx.b, ctx.t);
        let (n_q, n_kv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let layer = &self.layers[i];
        let x = rms_norm(&h, &layer.input_layernorm, c.rms_norm_eps).to_kind(kind);
        let (q, k, v) = match frozen {
            Some(f) => {
                let qkv = f.qkv.forward(&x);
                (
                    qkv.narrow(2, 0, n_q * d),
                    qkv.narrow(2, n_q * d, n_kv * d),
                    qkv.narrow(2, (n_q + n_kv) * d, n_kv * d),
                )
            }
            None => (
                layer.q_proj.forward(&x, kind),
                layer.k_proj.forward(&x, kind),
                layer.v_proj.forward(&x, kind),
            ),
        };
        let q = q.reshape([b, t, n_q, d]);
        let k = k.reshape([b, t, n_kv, d]);
        let v = v.reshape([b, t, n_kv, d]);
        let (q, k) = match (&layer.q_norm, &layer.k_norm) {
            (Some(qn), Some(kn)) => (
                rms_norm(&q, qn, c.rms_norm_eps).to_kind(kind),
                rms_norm(&k, kn, c.rms_norm_eps).to_kind(kind),
            ),
            _ => (q, k),
        };
        let q = apply_rope(&q.transpose(1, 2), ctx.cos, ctx.sin);
        let k = apply_rope(&k.transpose(1, 2), ctx.cos, ctx.sin);
        let v = v.transpose(1, 2);
        if let Some(collected) = collected {
            collected.push((k.shallow_clone(), v.shallow_clone()));
        }
        let attn = match (cache, ctx.fixed) {
            (_, Some((kv, index))) => {
                let (k, v) = kv.write(i, &k, &v, index);
                let bias = ctx.decode_bias.expect("the fixed-shape step has a bias");
                attend_fixed(&q, &k, &v, bias, ctx.cached_attention).to_kind(kind)
            }
            (Some(cache), None) => {
                let (k, v) = cache.append(i, &k, &v);
                if ctx.cached_attention {
                    attend_cached(&q, &k, &v, ctx.mask, ctx.decode_bias).to_kind(kind)
                } else {
                    sdpa(&q, &k, &v, ctx.mask)
                }
            }
            (None, None) => match past {
                Some((pk, pv)) => sdpa(
                    &q,
                    &Tensor::cat(&[pk, &k], 2),
                    &Tensor::cat(&[pv, &v], 2),
                    ctx.mask,
                ),
                None => sdpa(&q, &k, &v, ctx.mask),
            },
        };
        let attn = attn.transpose(1, 2).reshape([b, t, n_q * d]);
        let o = match frozen {
            Some(f) => f.o.forward(&attn),
            None => layer.o_proj.forward(&attn, kind),
        };
        h = h + o;
        let x = rms_norm(&h, &layer.post_attention_layernorm, c.rms_norm_eps).to_kind(kind);
        let down = match frozen {
            Some(f) => {
                let gu = f.gate_up.forward(&x);
                let inter = c.intermediate_size;
                f.down
                    .forward(&(gu.narrow(2, 0, inter).silu() * gu.narrow(2, inter, inter)))
            }
            None => {
                let gate = layer.gate_proj.forward(&x, kind);
                let up = layer.up_proj.forward(&x, kind);
                layer.down_proj.forward_swiglu(&gate, &up, kind)
            }
        };
        h + down
    }

    /// The input embeddings of `ids`, f32 (the residual stream's dtype; a shared bf16 base's
    /// table holds values f32 holds exactly).
    pub(crate) fn embed(&self, ids: &Tensor, sparse: bool) -> Tensor {
        Tensor::embedding(&self.embed_tokens, ids, -1, false, sparse).to_kind(Kind::Float)
    }

    /// Whether the input embedding's gradient may come as sparse rows: autograd then adds them
    /// into the dense `.grad` in place, where a dense embedding backward would first build a
    /// vocabulary-sized gradient (545 MB per pass for Qwen2.5's 151,936 x 896) and add that.
    /// Only when a dense `.grad` is certain to be there first: it already exists, or the
    /// unembedding shares the weight (its gradient is dense and arrives first: the chunked
    /// head's backward runs before the decoder's, and within one autograd graph the two are
    /// summed to a dense gradient before they reach `.grad`). A sparse first gradient would
    /// become the `.grad` itself, which the optimizer cannot step.
    fn sparse_embedding_grad(&self) -> bool {
        let w = &self.embed_tokens;
        w.requires_grad()
            && (w.grad().defined() || (self.lm_head.is_none() && self.head_lora.is_none()))
    }

    /// The final norm over the last layer's output: the final hidden states, f32.
    pub(crate) fn final_norm(&self, h: &Tensor) -> Tensor {
        rms_norm(h, &self.norm, self.config.rms_norm_eps)
    }
}

/// What every layer of one forward shares.
struct LayerContext<'a> {
    b: i64,
    t: i64,
    /// RoPE's tables for the new tokens' positions.
    cos: &'a Tensor,
    sin: &'a Tensor,
    /// The (B, 1, T, S_past + T) attention mask.
    mask: &'a Tensor,
    /// The one-token decode path's additive mask.
    decode_bias: Option<&'a Tensor>,
    /// Attention in f32 over the cache (CPU).
    cached_attention: bool,
    /// The fixed-shape decode step's cache and write positions (B, n_kv, 1, d)
    /// ([`crate::static_decode`]); `decode_bias` then covers its whole capacity.
    fixed: Option<(&'a StaticKv, &'a Tensor)>,
}

/// Which keys each new token attends to.
#[derive(Clone, Copy)]
pub(crate) enum Mask<'a> {
    /// (B, S_past + T) 0/1, 1 for real tokens: causal over the real keys of the token's row.
    Padding(&'a Tensor),
    /// A built (B, 1, T, S_past + T) boolean mask (packed rows, [`crate::packed`]).
    Full(&'a Tensor),
}

impl Mask<'_> {
    /// The (B, 1, T, S_past + T) mask of `t` new tokens after `past` earlier ones.
    pub(crate) fn to_4d(self, b: i64, t: i64, past: i64) -> Tensor {
        match self {
            Mask::Padding(m) => {
                assert_eq!(
                    m.size(),
                    [b, past + t],
                    "attention_mask must be (B, S_past + T) = ({b}, {})",
                    past + t
                );
                attention_mask_4d(m, t, past)
            }
            Mask::Full(m) => {
                assert_eq!(m.size(), [b, 1, t, past + t], "the attention mask's shape");
                m.shallow_clone()
            }
        }
    }
}

/// Where a forward finds the keys and values of positions before its new tokens.
pub(crate) enum PastKv<'a> {
    /// None: the new tokens are the whole sequence.
    None,
    /// A sampling cache, appended to.
    Cache(&'a mut KvCache),
    /// Per layer (B, Hkv, S_past, d) keys and values in the compute dtype, with autograd (a shared
    /// prefix, gathered to the rows); not appended to.
    Given(&'a [(Tensor, Tensor)]),
}
