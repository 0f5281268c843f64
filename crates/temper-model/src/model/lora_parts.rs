//! The model's LoRA adapters (attached, removed, merged) and the shared frozen base of a LoRA
//! snapshot.
use anyhow::Result;
use tch::{nn, Tensor};

use super::CausalLm;
use crate::lora::{LoraAdapter, LoraConfig};
use crate::shared_base::SharedBase;

impl CausalLm {
    pub fn lora_config(&self) -> Option<&LoraConfig> {
        self.lora.as_ref().map(|(c, _)| c)
    }

    pub(crate) fn lora_store(&self) -> Option<&nn::VarStore> {
        self.lora.as_ref().map(|(_, vs)| vs)
    }

    /// Adapters on `targets` of every layer, in a VarStore of their own named like PEFT's
    /// (`model.layers.0.self_attn.q_proj.lora_A.weight`).
    pub(crate) fn attach_lora(&mut self, cfg: &LoraConfig, targets: &[&str]) {
        let vs = nn::VarStore::new(self.device());
        let root = vs.root();
        for (i, layer) in self.layers.iter_mut().enumerate() {
            for (name, group, lin) in layer.linears_mut() {
                if targets.contains(&name) {
                    let p = &root / "model" / "layers" / i / group / name;
                    let (in_dim, out_dim) = lin.in_out();
                    lin.lora = Some(LoraAdapter::new(&p, in_dim, out_dim, cfg));
                }
            }
        }
        if targets.contains(&crate::lora::LORA_HEAD) {
            let (vocab, hidden) = (self.config.vocab_size, self.config.hidden_size);
            self.head_lora = Some(LoraAdapter::new(&(&root / "lm_head"), hidden, vocab, cfg));
        }
        self.lora = Some((cfg.clone(), vs));
    }

    /// Drops the adapters of [`CausalLm::add_lora`] and makes the base weights trainable again:
    /// the model computes as it did before them. Refused for a model on a [`SharedBase`], whose
    /// base weights are other models' too.
    pub fn remove_lora(&mut self) -> Result<()> {
        if self.shared_base.is_some() {
            anyhow::bail!(
                "this model's base weights are shared with other LoRA models: its adapters cannot be removed"
            );
        }
        for layer in &mut self.layers {
            for (_, _, lin) in layer.linears_mut() {
                lin.lora = None;
            }
        }
        self.head_lora = None;
        if self.lora.take().is_some() {
            self.vs.unfreeze();
        }
        Ok(())
    }

    /// Holds the frozen weight matrices the forwards cast to the compute dtype (the decoder
    /// layers' projections, an untied unembedding) in that dtype instead of f32: the same numbers
    /// every forward and backward computes with, in half the memory (a LoRA run's frozen base, as
    /// PEFT holds a bf16 base). The input embedding stays f32 (the residual stream reads it in
    /// f32; with tied embeddings it is the unembedding too), as do norms and biases; weights that
    /// train are untouched. The sampler's merged LoRA copy is then made from the rounded base.
    /// Returns the bytes freed. Nothing to do in f32.
    pub fn hold_frozen_in_compute_dtype(&mut self) -> u64 {
        let kind = self.compute.kind();
        if kind == tch::Kind::Float {
            return 0;
        }
        let mut frozen: Vec<&Tensor> = self
            .layers
            .iter()
            .flat_map(|l| l.linears().map(|(_, _, lin)| &lin.weight))
            .collect();
        frozen.extend(&self.lm_head);
        let mut freed = 0u64;
        tch::no_grad(|| {
            for w in frozen {
                if w.requires_grad() || w.kind() != tch::Kind::Float {
                    continue;
                }
                let narrow = w.to_kind(kind);
                freed += (w.numel() * (4 - kind.elt_size_in_bytes())) as u64;
                // In place: every handle on this variable (the layer's, the var store's) sees the
                // compute-dtype data, as `param.data = param.data.to(dtype)` does in PyTorch.
                w.shallow_clone().set_data(&narrow);
            }
        });
        freed
    }

    /// Whether this model's base weights are a [`SharedBase`]'s.
    pub fn shares_base(&self) -> bool {
        self.shared_base.is_some()
    }

    pub(crate) fn set_shared_base(&mut self, base: SharedBase) {
        self.shared_base = Some(base);
    }

    /// The unembedding the model computes with (its LoRA merged in), detached.
    pub(super) fn head_weight(&self) -> Tensor {
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        match crate::lora::active(&self.head_lora) {
            Some(l) => l.merged(head),
            None => head.shallow_clone(),
        }
    }

    /// Whether a saved folder needs its own `lm_head.weight` (an adapted unembedding of a model
    /// with tied embeddings).
    pub(crate) fn unties_head(&self) -> bool {
        self.head_lora.is_some() && self.lm_head.is_none()
    }

    /// [`CausalLm::named_parameters`] with LoRA merged into the adapted weights (what a plain HF
    /// folder of this model holds).
    pub fn merged_parameters(&self) -> Vec<(String, Tensor)> {
        self.merged_parameters_where(|_| true)
    }

    /// [`CausalLm::merged_parameters`] of the parts `keep` says (a decoder layer's, or those
    /// outside the layers): only those parts' adapters are merged, so a layer whose weights are
    /// elsewhere (a sharded run's, let go) is not read.
    pub(crate) fn merged_parameters_where(
        &self,
        keep: impl Fn(Part) -> bool,
    ) -> Vec<(String, Tensor)> {
        let mut merged = std::collections::HashMap::new();
        for (i, layer) in self.layers.iter().enumerate() {
            if !keep(Part::Layer(i)) {
                continue;
            }
            for (name, group, lin) in layer.linears() {
                if lin.lora.is_some() {
                    let key = format!("model.layers.{i}.{group}.{name}.weight");
                    merged.insert(key, lin.part().0);
                }
            }
        }
        if self.head_lora.is_some() && keep(Part::Rest) {
            merged.insert("lm_head.weight".into(), self.head_weight());
        }
        let mut out: Vec<(String, Tensor)> = self
            .named_parameters()
            .into_iter()
            .filter(|(n, _)| keep(Part::of(n)))
            .map(|(n, t)| match merged.remove(&n) {
                Some(m) => (n, m),
                None => (n, t),
            })
            .collect();
        // Tied embeddings with an adapted unembedding: the head becomes a weight of its own.
        if let Some(head) = merged.remove("lm_head.weight") {
            out.push(("lm_head.weight".into(), head));
        }
        out
    }

    /// The names [`CausalLm::merged_parameters_where`] gives for `part`, in its order, without
    /// reading a weight.
    pub(crate) fn merged_names(&self, part: Part) -> Vec<String> {
        let mut names: Vec<String> = self
            .named_parameters()
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| Part::of(n) == part)
            .collect();
        if part == Part::Rest && self.unties_head() {
            names.push("lm_head.weight".into());
        }
        names
    }
}

/// Where a parameter lives: in decoder layer `i`, or outside the layers (embeddings, the final
/// norm, the head).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    Layer(usize),
    Rest,
}

impl Part {
    /// The part of the parameter named `name` (HF names: `model.layers.<i>.` for layer i).
    pub(crate) fn of(name: &str) -> Part {
        name.strip_prefix("model.layers.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|i| i.parse().ok())
            .map_or(Part::Rest, Part::Layer)
    }
}
