//! `actor.strategy = "fsdp"`: the trainable parameters' f32 masters, gradients and AdamW moments
//! sharded over the data-parallel ranks, one flat unit per decoder layer as FSDP wraps them (and
//! one for everything outside the layers: embeddings, final norm, head). Each rank owns a
//! contiguous 1/N slice of every unit (the unit padded with zeros to a multiple of N).
//!
//! A step: each unit's summed gradient is reduce-scattered into the ranks' slices (instead of
//! all-reduced whole), the global norm is one all-reduce of the slices' squared norms, AdamW
//! steps each rank's slices, and the updated slices are all-gathered back into the model's
//! weights. The numbers are the replicated optimizer's: AdamW is elementwise, and the sum over
//! ranks is the same sum; only the norm adds up in another order (float rounding).
//!
//! With `fsdp_config.optimizer_offload` (or `param_offload`) the slices and moments live in host
//! memory and the step runs on the host's threads.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use tch::{Device, Kind, Tensor};
use temper_algo::optim::AdamW;

use crate::dist::Dist;

/// One flat unit: parameters (by index into the trainable list) laid end to end.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    /// `model.layers.<i>` for a decoder layer's parameters, `model.rest` for the others.
    pub name: String,
    /// (index into the parameter list, offset in the unit, elements), in the list's order.
    pub members: Vec<(usize, i64, i64)>,
    pub numel: i64,
}

impl Unit {
    /// Elements each of `world` ranks owns (the unit padded to a multiple of `world`).
    pub fn shard(&self, world: usize) -> i64 {
        (self.numel + world as i64 - 1) / world as i64
    }
}

/// The unit a parameter belongs to: its decoder layer (`...layers.<i>.`, LoRA adapters too), or
/// `model.rest`.
fn unit_name(param: &str) -> String {
    let parts: Vec<&str> = param.split('.').collect();
    match parts
        .windows(2)
        .find(|w| w[0] == "layers" && w[1].parse::<usize>().is_ok())
    {
        Some(w) => format!("model.layers.{}", w[1]),
        None => "model.rest".to_string(),
    }
}

/// The units of `params`, each in the order its first parameter appears.
pub(crate) fn units_of(params: &[(String, Tensor)]) -> Vec<Unit> {
    let mut units: Vec<Unit> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (i, (name, p)) in params.iter().enumerate() {
        let u = unit_name(name);
        let k = *index.entry(u.clone()).or_insert_with(|| {
            units.push(Unit {
                name: u,
                members: vec![],
                numel: 0,
            });
            units.len() - 1
        });
        let unit = &mut units[k];
        let n = p.numel() as i64;
        unit.members.push((i, unit.numel, n));
        unit.numel += n;
    }
    units
}

/// AdamW over this rank's slices of every unit.
pub(crate) struct ShardedAdamW {
    pub(crate) units: Vec<Unit>,
    /// Per unit, this rank's slice of its f32 weights (named by the unit), with a gradient: what
    /// AdamW steps.
    masters: Vec<(String, Tensor)>,
    pub(crate) adamw: AdamW,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// Where the parameters (and their gradients) live.
    device: Device,
}

impl ShardedAdamW {
    /// Slices `params` (f32, one device) over `dist`'s ranks; the slices and `adamw`'s state
    /// (built by `make` for the slices) on `home`.
    pub fn new(
        params: &[(String, Tensor)],
        dist: &Dist,
        home: Device,
        make: impl FnOnce(&[(String, Tensor)]) -> AdamW,
    ) -> Result<Self> {
        let Some((_, first)) = params.first() else {
            bail!("actor.strategy = fsdp: the model has no trainable parameters");
        };
        let device = first.device();
        if let Some((name, p)) = params
            .iter()
            .find(|(_, p)| p.kind() != Kind::Float || p.device() != device)
        {
            bail!(
                "actor.strategy = fsdp: parameter {name} is {:?} on {:?}; the sharded optimizer needs every \
                 trainable parameter in f32 on one device",
                p.kind(),
                p.device()
            );
        }
        let units = units_of(params);
        let world = dist.world;
        let masters = tch::no_grad(|| {
            units
                .iter()
                .map(|u| {
                    let shard = u.shard(world);
                    let master = Tensor::zeros([shard], (Kind::Float, home));
                    let (lo, hi) = owned(dist.rank, shard, u.numel);
                    for &(i, off, n) in &u.members {
                        let (a, b) = (off.max(lo), (off + n).min(hi));
                        if a < b {
                            let src = params[i].1.reshape([-1]).narrow(0, a - off, b - a);
                            master.narrow(0, a - lo, b - a).copy_(&src);
                        }
                    }
                    (u.name.clone(), master.set_requires_grad(true))
                })
                .collect::<Vec<_>>()
        });
        temper_kernels::zero_grads_if_missing(&masters)?;
        let adamw = make(&masters);
        Ok(ShardedAdamW {
            units,
            masters,
            adamw,
            rank: dist.rank,
            world,
            device,
        })
    }

    /// Each unit's gradient summed over the ranks into this rank's slice; the parameters'
    /// gradients are freed. Returns false when no rank had any gradient (then no step is taken,
    /// as PyTorch's optimizer takes none without gradients).
    pub fn reduce_grads(&mut self, dist: &Dist, params: &[(String, Tensor)]) -> Result<bool> {
        let mine = params.iter().any(|(_, p)| p.grad().defined()) as u8 as f64;
        let mut any = [mine];
        dist.sum_f64(&mut any)?;
        if any[0] == 0.0 {
            return Ok(false);
        }
        for (u, (_, master)) in self.units.iter().zip(&self.masters) {
            let shard = u.shard(self.world);
            let flat = Tensor::zeros([shard * self.world as i64], (Kind::Float, self.device));
            tch::no_grad(|| {
                for &(i, off, n) in &u.members {
                    let g = params[i].1.grad();
                    if g.defined() {
                        flat.narrow(0, off, n).copy_(&g.reshape([-1]));
                    }
                }
            });
            let out = Tensor::zeros([shard], (Kind::Float, self.device));
            dist.reduce_scatter_sum(&flat, &out)
                .with_context(|| format!("reduce-scattering the gradients of {}", u.name))?;
            tch::no_grad(|| master.grad().copy_(&out));
        }
        temper_kernels::clear_grads(params)?;
        Ok(true)
    }

    /// `clip_grad_norm_` over the whole model from the slices: the total norm is the square
    /// root of the ranks' summed squared slice norms (one all-reduce); every slice is scaled by
    /// PyTorch's `min(max_norm / (norm + 1e-6), 1)` when `max_norm > 0`. Returns the norm.
    pub fn clip_grad_norm(&self, dist: &Dist, max_norm: f64) -> Result<f64> {
        let grads: Vec<Tensor> = self.masters.iter().map(|(_, m)| m.grad()).collect();
        let mut sq = [tch::no_grad(|| {
            grads
                .iter()
                .map(|g| g.to_kind(Kind::Double).square().sum(Kind::Double))
                .fold(Tensor::from(0.0f64), |a, b| a + b.to(Device::Cpu))
                .double_value(&[])
        })];
        dist.sum_f64(&mut sq)?;
        let norm = sq[0].sqrt();
        if max_norm > 0.0 && norm.is_finite() {
            // The coefficient in f32, as PyTorch computes it from its f32 norm.
            let total = Tensor::from(norm as f32);
            let coef = ((&total + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
            tch::no_grad(|| {
                for g in &grads {
                    let _ = g.shallow_clone().g_mul_(&coef.to(g.device()));
                }
            });
        }
        Ok(norm)
    }

    /// AdamW on this rank's slices at `lr`, then every unit's slices gathered back into the
    /// parameters.
    pub fn step(&mut self, dist: &Dist, params: &[(String, Tensor)], lr: f64) -> Result<()> {
        self.adamw.lr = lr;
        self.adamw.step(&self.masters)?;
        for (u, (_, master)) in self.units.iter().zip(&self.masters) {
            let shard = u.shard(self.world);
            let full = Tensor::empty([shard * self.world as i64], (Kind::Float, self.device));
            let mine = tch::no_grad(|| master.detach().to(self.device));
            dist.all_gather_into(&mine, &full)
                .with_context(|| format!("gathering the weights of {}", u.name))?;
            tch::no_grad(|| {
                for &(i, off, n) in &u.members {
                    let p = &params[i].1;
                    p.shallow_clone()
                        .copy_(&full.narrow(0, off, n).view(p.size().as_slice()));
                }
            });
        }
        Ok(())
    }

    /// This rank's range `[lo, hi)` of unit `u`'s elements (padding excluded).
    pub fn owned(&self, u: &Unit) -> (i64, i64) {
        owned(self.rank, u.shard(self.world), u.numel)
    }
}

/// The elements of a unit of `numel` that `rank` owns with slices of `shard`.
fn owned(rank: usize, shard: i64, numel: i64) -> (i64, i64) {
    let lo = (rank as i64 * shard).min(numel);
    (lo, (lo + shard).min(numel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_group_by_decoder_layer() {
        assert_eq!(
            unit_name("model.layers.12.self_attn.q_proj.weight"),
            "model.layers.12"
        );
        assert_eq!(
            unit_name("model.layers.0.mlp.down_proj.lora_A.weight"),
            "model.layers.0"
        );
        assert_eq!(unit_name("model.embed_tokens.weight"), "model.rest");
        assert_eq!(unit_name("lm_head.weight"), "model.rest");
        assert_eq!(owned(0, 3, 7), (0, 3));
        assert_eq!(owned(2, 3, 7), (6, 7));
        assert_eq!(owned(3, 2, 5), (5, 5));
    }
}
