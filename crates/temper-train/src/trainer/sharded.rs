//! `actor.strategy = "fsdp"`: the trainable parameters' f32 masters, gradients and AdamW moments
//! sharded over the data-parallel ranks, one flat unit per decoder layer as FSDP wraps them (and
//! one for everything outside the layers: embeddings, final norm, head). Each rank owns a
//! contiguous 1/N slice of every unit (the unit padded with zeros to a multiple of N).
//!
//! An update: with activation checkpointing the decoder layers let go of their weights, and the
//! model gathers each layer from the ranks' slices while it runs it, in the forward and again in
//! the backward, which reduce-scatters the layer's gradient into the slices as it leaves the
//! layer (ZeRO-3; `fsdp_config.reshard_after_forward = false` keeps the forward's gathered
//! layers to the backward). Without checkpointing the weights stay whole and each unit's
//! gradient is reduce-scattered after the mini-batch (ZeRO-2). The global norm is one
//! all-reduce of the slices' squared norms; AdamW steps each rank's slices. Outside the update
//! (sampling, the old and reference log-probs, checkpoints) the weights are whole.
//!
//! The numbers are the replicated optimizer's: AdamW is elementwise and a sum over ranks is the
//! same sum; the norm adds up in another order (float rounding), and with several micro-batches
//! per mini-batch a per-layer update sums each micro-batch over the ranks first.
//!
//! With `fsdp_config.optimizer_offload` (or `param_offload`) the slices and moments live in host
//! memory and the step runs on the host's threads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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

/// AdamW over this rank's slices of every unit; the slices themselves (shared with the model,
/// which asks them for its layers' weights during a sharded update) in [`Shards`].
pub struct ShardedAdamW {
    pub(crate) shards: Arc<Shards>,
    pub(crate) adamw: AdamW,
}

/// This rank's slices of every unit, the model's parameters they are slices of, and which units
/// the parameters hold whole now.
pub struct Shards {
    dist: Arc<Dist>,
    pub(crate) units: Vec<Unit>,
    /// The trainable parameters' shapes when whole.
    shapes: Vec<Vec<i64>>,
    /// Decoder layer -> its unit.
    layer_units: Vec<Option<usize>>,
    /// Where the parameters (and their gradients) live.
    device: Device,
    /// Free a layer's gathered weights after its forward (ZeRO-3) or keep them to its backward.
    reshard_after_forward: bool,
    /// The tensors and what they hold now (behind a lock: the model, which may move between
    /// threads, shares them; one thread uses them at a time).
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    /// The trainable parameters (sharing the model's tensors).
    params: Vec<(String, Tensor)>,
    /// Per unit, this rank's slice of its f32 weights (named by the unit), with a gradient: what
    /// AdamW steps.
    masters: Vec<(String, Tensor)>,
    /// The decoder layers' weights are gathered when the model asks for a layer and let go
    /// after (everywhere but a ZeRO-2 update, which holds them whole).
    on_demand: bool,
    /// An update is running (its backward passes reduce each layer's gradient).
    in_update: bool,
    /// Per unit: its parameters hold the whole weights.
    whole: Vec<bool>,
    /// Some gradient was reduced since the last step.
    grads_seen: bool,
    /// The first collective that failed inside the model's forward or backward.
    error: Option<anyhow::Error>,
    /// The most [`Shards::held_bytes`] since the update began, taken as each layer's backward
    /// ends and before each mini-batch's gradients are reduced (the gradients all there).
    peak: i64,
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("units", &self.units.len())
            .field("rank", &self.dist.rank)
            .field("world", &self.dist.world)
            .finish_non_exhaustive()
    }
}

impl ShardedAdamW {
    /// Slices `params` (f32, one device) over `dist`'s ranks; the slices and `adamw`'s state
    /// (built by `make` for the slices) on `home`.
    pub fn new(
        params: &[(String, Tensor)],
        dist: Arc<Dist>,
        home: Device,
        reshard_after_forward: bool,
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
        let mut layer_units = vec![];
        for (k, u) in units.iter().enumerate() {
            if let Some(i) = u
                .name
                .strip_prefix("model.layers.")
                .and_then(|i| i.parse::<usize>().ok())
            {
                if layer_units.len() <= i {
                    layer_units.resize(i + 1, None);
                }
                layer_units[i] = Some(k);
            }
        }
        let n = units.len();
        let mut held = Held {
            params: params
                .iter()
                .map(|(n, p)| (n.clone(), p.shallow_clone()))
                .collect(),
            masters,
            on_demand: true,
            in_update: false,
            whole: vec![true; n],
            grads_seen: false,
            error: None,
            peak: 0,
        };
        let shards = Shards {
            dist,
            units,
            shapes: params.iter().map(|(_, p)| p.size()).collect(),
            layer_units,
            device,
            reshard_after_forward,
            held: Mutex::new(Held::default()),
        };
        // The layers let go of their whole weights before the slices' gradients and moments
        // exist, and the heap hands them back: the process never holds both (its resident peak
        // would keep the sum).
        shards.release_layers(&mut held);
        temper_kernels::memory::release_free_memory();
        temper_kernels::zero_grads_if_missing(&held.masters)?;
        let adamw = make(&held.masters);
        *shards.held() = held;
        Ok(ShardedAdamW {
            shards: Arc::new(shards),
            adamw,
        })
    }

    /// AdamW on this rank's slices at `lr`, then the units the parameters hold whole gathered
    /// again from the new slices (during a per-layer update the layers are gathered when next
    /// used).
    pub fn step(&mut self, lr: f64) -> Result<()> {
        let s = &self.shards;
        let mut h = s.held();
        self.adamw.lr = lr;
        self.adamw.step(&h.masters)?;
        for k in 0..s.units.len() {
            if !(h.on_demand && s.is_layer_unit(k)) {
                s.gather(&mut h, k)?;
            }
        }
        s.zero_master_grads(&mut h);
        Ok(())
    }
}

impl Shards {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        // Nothing it keeps is left half-changed by a panic that matters: the run stops.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn rank(&self) -> usize {
        self.dist.rank
    }

    pub fn world(&self) -> usize {
        self.dist.world
    }

    fn is_layer_unit(&self, k: usize) -> bool {
        self.layer_units.contains(&Some(k))
    }

    /// This rank's range `[lo, hi)` of unit `u`'s elements (padding excluded).
    pub fn owned(&self, u: &Unit) -> (i64, i64) {
        owned(self.dist.rank, u.shard(self.dist.world), u.numel)
    }

    /// Unit `k`'s whole weights into its parameters, from every rank's slice (in place when
    /// they are whole already, so their storage stays where it is).
    fn gather(&self, h: &mut Held, k: usize) -> Result<()> {
        let u = &self.units[k];
        let world = self.dist.world as i64;
        let full = Tensor::empty(
            [u.shard(self.dist.world) * world],
            (Kind::Float, self.device),
        );
        let mine = tch::no_grad(|| h.masters[k].1.detach().to(self.device));
        self.dist
            .all_gather_into(&mine, &full)
            .with_context(|| format!("gathering the weights of {}", u.name))?;
        tch::no_grad(|| {
            for &(i, off, n) in &u.members {
                let p = &h.params[i].1;
                let part = full.narrow(0, off, n).view(self.shapes[i].as_slice());
                if p.numel() as i64 == n {
                    p.shallow_clone().copy_(&part);
                } else {
                    p.shallow_clone().set_data(&part);
                }
            }
        });
        h.whole[k] = true;
        Ok(())
    }

    /// Unit `k`'s matrices let go of their weights (empty until gathered again); its vectors
    /// (norms, biases: a layer's few thousand values, which decoding reads outside the sampling
    /// copies) stay whole.
    fn release(&self, h: &mut Held, k: usize) {
        let empty = Tensor::empty([0], (Kind::Float, self.device));
        tch::no_grad(|| {
            for &(i, _, _) in &self.units[k].members {
                if self.shapes[i].len() >= 2 {
                    h.params[i].1.shallow_clone().set_data(&empty);
                }
            }
        });
        h.whole[k] = false;
    }

    /// Unit `k`'s gradients (those its parameters have: zeros for the others) summed over the
    /// ranks and added into this rank's slice; the parameters' gradients are freed.
    fn reduce(&self, h: &mut Held, k: usize) -> Result<()> {
        let u = &self.units[k];
        let world = self.dist.world as i64;
        let shard = u.shard(self.dist.world);
        let flat = Tensor::zeros([shard * world], (Kind::Float, self.device));
        let mut seen = false;
        tch::no_grad(|| {
            for &(i, off, n) in &u.members {
                let g = h.params[i].1.grad();
                if g.defined() {
                    flat.narrow(0, off, n).copy_(&g.reshape([-1]));
                    seen = true;
                }
            }
        });
        let out = Tensor::zeros([shard], (Kind::Float, self.device));
        self.dist
            .reduce_scatter_sum(&flat, &out)
            .with_context(|| format!("reduce-scattering the gradients of {}", u.name))?;
        tch::no_grad(|| {
            let mut g = h.masters[k].1.grad();
            let _ = g.g_add_(&out.to(g.device()));
        });
        let members: Vec<(String, Tensor)> = u
            .members
            .iter()
            .map(|&(i, _, _)| (h.params[i].0.clone(), h.params[i].1.shallow_clone()))
            .collect();
        temper_kernels::clear_grads(&members)?;
        h.grads_seen |= seen;
        Ok(())
    }

    fn zero_master_grads(&self, h: &mut Held) {
        tch::no_grad(|| {
            for (_, m) in &h.masters {
                let _ = m.grad().zero_();
            }
        });
        h.grads_seen = false;
    }

    /// An update begins. With `per_layer` (an activation-checkpointed update) the decoder
    /// layers stay gathered on demand, and each layer's backward reduces its gradient; without,
    /// every layer is gathered whole for the update (ZeRO-2: autograd keeps the weights it used).
    pub fn begin_update(&self, per_layer: bool) -> Result<()> {
        let mut h = self.held();
        h.in_update = true;
        h.peak = 0;
        h.on_demand = per_layer;
        if !per_layer {
            self.gather_layers(&mut h)?;
        }
        Ok(())
    }

    /// The update is over: the layers are gathered on demand again, and let go now.
    pub fn end_update(&self) -> Result<()> {
        let mut h = self.held();
        h.in_update = false;
        h.on_demand = true;
        self.release_layers(&mut h);
        take(&mut h)
    }

    /// Every decoder layer whole in the model until [`Shards::let_go`] (or the next sweep over
    /// the layers): for what reads all the weights at once (writing a checkpoint or the
    /// servers' weights, copying them to the sampler's device, a caller reading the whole model: `Trainer::whole_model`).
    pub fn hold_whole(&self) -> Result<()> {
        let mut h = self.held();
        self.gather_layers(&mut h)?;
        take(&mut h)
    }

    /// The decoder layers let go of their weights (gathered on demand).
    pub fn let_go(&self) {
        let mut h = self.held();
        self.release_layers(&mut h);
    }

    fn gather_layers(&self, h: &mut Held) -> Result<()> {
        for k in self.layer_units.iter().flatten() {
            if !h.whole[*k] {
                self.gather(h, *k)?;
            }
        }
        Ok(())
    }

    fn release_layers(&self, h: &mut Held) {
        for k in self.layer_units.iter().flatten() {
            self.release(h, *k);
        }
    }

    /// The first collective that failed inside the model's forward or backward, as an error.
    pub fn take_error(&self) -> Result<()> {
        take(&mut self.held())
    }

    /// After a mini-batch's backward passes: the gradients not yet in the slices are reduced
    /// into them (during a per-layer update the layers' were, as each layer's backward ended).
    /// Returns false when no rank had any gradient (then no step is taken, as PyTorch's
    /// optimizer takes none without gradients).
    pub fn reduce_grads(&self) -> Result<bool> {
        let mut h = self.held();
        take(&mut h)?;
        note_peak(&mut h);
        for k in 0..self.units.len() {
            if !(h.on_demand && self.is_layer_unit(k)) {
                self.reduce(&mut h, k)?;
            }
        }
        let mut any = [h.grads_seen as u8 as f64];
        self.dist.sum_f64(&mut any)?;
        if any[0] == 0.0 {
            self.zero_master_grads(&mut h);
            return Ok(false);
        }
        Ok(true)
    }

    /// `clip_grad_norm_` over the whole model from the slices: the total norm is the square
    /// root of the ranks' summed squared slice norms (one all-reduce); every slice is scaled by
    /// PyTorch's `min(max_norm / (norm + 1e-6), 1)` when `max_norm > 0`. Returns the norm.
    pub fn clip_grad_norm(&self, max_norm: f64) -> Result<f64> {
        let h = self.held();
        let grads: Vec<Tensor> = h.masters.iter().map(|(_, m)| m.grad()).collect();
        let mut sq = [tch::no_grad(|| {
            grads
                .iter()
                .map(|g| g.to_kind(Kind::Double).square().sum(Kind::Double))
                .fold(Tensor::from(0.0f64), |a, b| a + b.to(Device::Cpu))
                .double_value(&[])
        })];
        self.dist.sum_f64(&mut sq)?;
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

    /// A step that is not taken (a non-finite norm): the reduced gradients are dropped.
    pub fn skip_step(&self) {
        self.zero_master_grads(&mut self.held());
    }

    /// The most bytes this rank held for the trainable weights since the update began: the
    /// slices with their gradients and AdamW's two moments, and every parameter that is whole
    /// (with its gradient if it has one), summed from the tensors.
    pub fn peak_held_bytes(&self) -> i64 {
        let mut h = self.held();
        note_peak(&mut h);
        h.peak
    }
}

/// Records the bytes held now if they are the most since the update began.
fn note_peak(h: &mut Held) {
    let slices: i64 = h.masters.iter().map(|(_, m)| m.numel() as i64).sum();
    let whole: i64 = h
        .params
        .iter()
        .map(|(_, p)| {
            let g = p.grad();
            p.numel() as i64 + if g.defined() { g.numel() as i64 } else { 0 }
        })
        .sum();
    h.peak = h.peak.max(4 * (4 * slices + whole));
}

/// The recorded error, taken.
fn take(h: &mut Held) -> Result<()> {
    match h.error.take() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn record(h: &mut Held, e: anyhow::Error) {
    if h.error.is_none() {
        h.error = Some(e);
    }
}

impl temper_model::LayerResidency for Shards {
    fn fetch(&self, i: usize) {
        let Some(Some(k)) = self.layer_units.get(i).copied() else {
            return;
        };
        let mut h = self.held();
        if h.whole[k] {
            return;
        }
        if let Err(e) = self.gather(&mut h, k) {
            // The forward goes on over zeros (every shape right) and the update stops with the
            // error after this pass.
            tch::no_grad(|| {
                for &(m, _, _) in &self.units[k].members {
                    let zeros =
                        Tensor::zeros(self.shapes[m].as_slice(), (Kind::Float, self.device));
                    h.params[m].1.shallow_clone().set_data(&zeros);
                }
            });
            h.whole[k] = true;
            record(&mut h, e);
        }
    }

    fn release_after_forward(&self, i: usize) {
        let Some(Some(k)) = self.layer_units.get(i).copied() else {
            return;
        };
        let mut h = self.held();
        // In an update, `reshard_after_forward = false` keeps the layer to its backward.
        if h.on_demand && (self.reshard_after_forward || !h.in_update) {
            self.release(&mut h, k);
        }
    }

    fn backward_done(&self, i: usize) {
        let Some(Some(k)) = self.layer_units.get(i).copied() else {
            return;
        };
        let mut h = self.held();
        if !(h.in_update && h.on_demand) {
            return;
        }
        note_peak(&mut h);
        if let Err(e) = self.reduce(&mut h, k) {
            record(&mut h, e);
        }
        self.release(&mut h, k);
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
