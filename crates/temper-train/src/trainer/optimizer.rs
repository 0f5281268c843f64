//! The learner's optimizer as `actor.strategy` places it: `dp` keeps AdamW's whole state on every
//! rank and sums whole gradients over the ranks (DDP); `fsdp` shards it ([`ShardedAdamW`]). Its
//! state in a checkpoint: `optimizer.safetensors` (one file, per parameter) for `dp`,
//! `optimizer/` (`layout.json` and one `rank-<r>.safetensors` of slices per rank) for `fsdp`.
//! Either loads into either, at any world size: the saved values are placed by where they lie in
//! each unit's flat layout.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};
use temper_algo::optim::AdamW;

use super::sharded::{units_of, ShardedAdamW, Unit};
use crate::config::{ActorConfig, Strategy};
use crate::dist::Dist;

/// Gradients are summed over data-parallel ranks in flat buckets of this size (DDP's default).
const GRAD_BUCKET_BYTES: usize = 25 << 20;

/// AdamW over the trainable parameters, replicated (`dp`) or sharded over the ranks (`fsdp`): what
/// the trainer's update steps, and what `temper bench train --nproc` times.
pub enum Optimizer {
    Replicated(AdamW),
    Sharded(ShardedAdamW),
}

impl Optimizer {
    /// AdamW over `params` as `actor` configures it, sharded over `dist`'s ranks with
    /// `strategy = fsdp` (or offloaded with one rank); the notes say what the settings did.
    pub fn new(
        params: &[(String, Tensor)],
        actor: &ActorConfig,
        dist: &Arc<Dist>,
        notes: &mut Vec<String>,
    ) -> Result<Self> {
        let o = &actor.optim;
        let make = |p: &[(String, Tensor)]| {
            AdamW::new(p, o.lr, (o.betas[0], o.betas[1]), o.eps, o.weight_decay).with_fused(o.fused)
        };
        let f = &actor.fsdp_config;
        let offload = f.optimizer_offload || f.param_offload;
        let device = params.first().map_or(Device::Cpu, |(_, p)| p.device());
        match actor.strategy {
            Strategy::Dp => {
                if offload || !f.reshard_after_forward {
                    notes.push(
                        "actor.fsdp_config: read only with actor.strategy = fsdp; this run is dp, \
                         every rank holding the whole optimizer state"
                            .into(),
                    );
                }
                Ok(Optimizer::Replicated(make(params)))
            }
            Strategy::Fsdp if dist.world == 1 && !offload => {
                notes.push(
                    "actor.strategy = fsdp over one rank: nothing to shard, the same run as dp"
                        .into(),
                );
                Ok(Optimizer::Replicated(make(params)))
            }
            Strategy::Fsdp => {
                let home = if offload { Device::Cpu } else { device };
                if offload && device == Device::Cpu {
                    notes.push(
                        "actor.fsdp_config offload: the optimizer state is in host memory already \
                         (a CPU run)"
                            .into(),
                    );
                }
                if !actor.gradient_checkpointing {
                    notes.push(
                        "actor.strategy = fsdp without actor.gradient_checkpointing: the decoder \
                         layers' weights stay whole through the update (ZeRO-2); with checkpointing \
                         each layer is gathered only while it runs (ZeRO-3)"
                            .into(),
                    );
                }
                Ok(Optimizer::Sharded(ShardedAdamW::new(
                    params,
                    dist.clone(),
                    home,
                    f.reshard_after_forward,
                    make,
                )?))
            }
        }
    }

    /// The model's layers' weights, when they come from slices (a sharded optimizer): the model
    /// asks for each layer while it runs it.
    pub fn layer_residency(&self) -> Option<Arc<dyn temper_model::LayerResidency>> {
        match self {
            Optimizer::Replicated(_) => None,
            Optimizer::Sharded(s) => {
                Some(s.shards.clone() as Arc<dyn temper_model::LayerResidency>)
            }
        }
    }

    /// An update begins: a sharded optimizer whose update is activation-checkpointed
    /// (`per_layer`) gathers each decoder layer while it runs (and reduces its gradient as its
    /// backward ends); otherwise it holds them whole for the update.
    pub fn begin_update(&self, per_layer: bool) -> Result<()> {
        match self {
            Optimizer::Replicated(_) => Ok(()),
            Optimizer::Sharded(s) => s.shards.begin_update(per_layer),
        }
    }

    /// A sharded optimizer gathers every decoder layer whole into the model (every rank calls
    /// it), for what reads all the weights at once; [`Optimizer::let_go`] ends it.
    pub fn hold_whole(&self) -> Result<()> {
        match self {
            Optimizer::Replicated(_) => Ok(()),
            Optimizer::Sharded(s) => s.shards.hold_whole(),
        }
    }

    /// A sharded optimizer's decoder layers let go of their weights (gathered when next used).
    pub fn let_go(&self) {
        if let Optimizer::Sharded(s) = self {
            s.shards.let_go();
        }
    }

    /// After each micro-batch: a collective that failed inside the model's passes, as an error.
    pub fn check(&self) -> Result<()> {
        match self {
            Optimizer::Replicated(_) => Ok(()),
            Optimizer::Sharded(s) => s.shards.take_error(),
        }
    }

    /// The update is over: every weight whole in the model again.
    pub fn end_update(&self) -> Result<()> {
        match self {
            Optimizer::Replicated(_) => Ok(()),
            Optimizer::Sharded(s) => s.shards.end_update(),
        }
    }

    /// After a mini-batch's backward passes: the gradients summed over the ranks (each rank's
    /// slices only, when sharded). Returns false when there is nothing to step.
    pub fn reduce_grads(&mut self, dist: &Dist, params: &[(String, Tensor)]) -> Result<bool> {
        match self {
            Optimizer::Replicated(_) => {
                dist.all_reduce_grads(params, GRAD_BUCKET_BYTES)?;
                Ok(true)
            }
            Optimizer::Sharded(s) => s.shards.reduce_grads(),
        }
    }

    /// `clip_grad_norm_` over every gradient (of every rank's slices); the norm before clipping.
    pub fn clip_grad_norm(&self, params: &[(String, Tensor)], max_norm: f64) -> Result<f64> {
        match self {
            Optimizer::Replicated(_) => temper_algo::optim::clip_grad_norm(params, max_norm),
            Optimizer::Sharded(s) => s.shards.clip_grad_norm(max_norm),
        }
    }

    /// One AdamW step at `lr`; the parameters hold the new weights after it on every rank.
    pub fn step(&mut self, params: &[(String, Tensor)], lr: f64) -> Result<()> {
        match self {
            Optimizer::Replicated(a) => {
                a.lr = lr;
                a.step(params)
            }
            Optimizer::Sharded(s) => s.step(lr),
        }
    }

    /// A step not taken (a non-finite norm).
    pub fn skip_step(&self) {
        if let Optimizer::Sharded(s) = self {
            s.shards.skip_step();
        }
    }

    /// The most bytes this rank held for the trainable weights since the update began (a
    /// replicated optimizer: now): the weights it holds whole, their gradients, and AdamW's state
    /// (a sharded optimizer's slices with their gradients and moments). Summed from the tensors.
    pub fn peak_held_bytes(&self, params: &[(String, Tensor)]) -> i64 {
        match self {
            Optimizer::Replicated(_) => params
                .iter()
                .map(|(_, p)| {
                    let g = p.grad();
                    4 * (3 * p.numel() as i64 + if g.defined() { g.numel() as i64 } else { 0 })
                })
                .sum(),
            Optimizer::Sharded(s) => s.shards.peak_held_bytes(),
        }
    }

    pub fn is_sharded(&self) -> bool {
        matches!(self, Optimizer::Sharded(_))
    }

    /// Writes this rank's part of the state for the checkpoint being written in `staging` (every
    /// rank calls it): nothing for a replicated optimizer (rank 0 writes it whole), this rank's
    /// slices for a sharded one.
    pub fn stage(&self, staging: &Path) -> Result<()> {
        if let Optimizer::Sharded(s) = self {
            std::fs::create_dir_all(staging)
                .with_context(|| format!("creating {}", staging.display()))?;
            s.adamw.save(&staging.join(rank_file(s.shards.rank())))?;
        }
        Ok(())
    }

    /// Rank 0: the state into the checkpoint folder `ckpt` being filled (the ranks' staged
    /// slices moved in from `staging`, with their layout).
    pub fn write(&self, ckpt: &Path, staging: &Path, params: &[(String, Tensor)]) -> Result<()> {
        match self {
            Optimizer::Replicated(a) => a.save(&ckpt.join("optimizer.safetensors")),
            Optimizer::Sharded(s) => {
                let dir = ckpt.join("optimizer");
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                for r in 0..s.shards.world() {
                    let from = staging.join(rank_file(r));
                    std::fs::rename(&from, dir.join(rank_file(r))).with_context(|| {
                        format!("moving rank {r}'s optimizer slices from {}", from.display())
                    })?;
                }
                let _ = std::fs::remove_dir(staging);
                let layout = Layout::of(&s.shards.units, params, s.shards.world());
                crate::rundir::write_json(&dir.join("layout.json"), &serde_json::to_value(layout)?)
            }
        }
    }

    /// Restores the state saved in checkpoint folder `ckpt` by either strategy at any world
    /// size (resharded as it is read).
    pub fn load(&mut self, ckpt: &Path, params: &[(String, Tensor)]) -> Result<()> {
        let units = match self {
            Optimizer::Replicated(_) => units_of(params),
            Optimizer::Sharded(s) => s.shards.units.clone(),
        };
        // Where each saved piece goes: (moment tensor, its first element's place in the unit).
        let mut targets: HashMap<(usize, usize), Vec<(Tensor, i64)>> = HashMap::new();
        let mut expected: HashMap<(usize, usize), i64> = HashMap::new();
        for (k, u) in units.iter().enumerate() {
            match self {
                Optimizer::Replicated(a) => {
                    for &(i, off, n) in &u.members {
                        let (m, v) = a
                            .moments(&params[i].0)
                            .context("the optimizer steps every trainable parameter")?;
                        for (which, t) in [m, v].into_iter().enumerate() {
                            targets
                                .entry((k, which))
                                .or_default()
                                .push((t.reshape([-1]), off));
                            *expected.entry((k, which)).or_default() += n;
                        }
                    }
                }
                Optimizer::Sharded(s) => {
                    let (lo, hi) = s.shards.owned(u);
                    let (m, v) = s.adamw.moments(&u.name).context("a unit's slice")?;
                    for (which, t) in [m, v].into_iter().enumerate() {
                        targets
                            .entry((k, which))
                            .or_default()
                            .push((t.narrow(0, 0, hi - lo), lo));
                        *expected.entry((k, which)).or_default() += hi - lo;
                    }
                }
            }
        }
        let mut filled: HashMap<(usize, usize), i64> = HashMap::new();
        let step = read_pieces(ckpt, &units, params, |key, start, values| {
            let n = values.numel() as i64;
            for (dst, at) in targets.get(&key).into_iter().flatten() {
                let len = dst.numel() as i64;
                let (a, b) = (start.max(*at), (start + n).min(at + len));
                if a < b {
                    tch::no_grad(|| {
                        dst.narrow(0, a - at, b - a)
                            .copy_(&values.narrow(0, a - start, b - a))
                    });
                    *filled.entry(key).or_default() += b - a;
                }
            }
            Ok(())
        })?;
        for (key, want) in &expected {
            if filled.get(key).copied().unwrap_or(0) != *want {
                bail!(
                    "{}: the optimizer state of {} is incomplete",
                    ckpt.display(),
                    units[key.0].name
                );
            }
        }
        match self {
            Optimizer::Replicated(a) => a.restore_steps(step),
            Optimizer::Sharded(s) => s.adamw.restore_steps(step),
        }
        Ok(())
    }
}

fn rank_file(rank: usize) -> String {
    format!("rank-{rank}.safetensors")
}

/// `optimizer/layout.json`: how a sharded state was cut, so that any world size can read it.
#[derive(Debug, Serialize, Deserialize)]
struct Layout {
    world: usize,
    units: Vec<SavedUnit>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SavedUnit {
    name: String,
    numel: i64,
    /// Elements per rank file (the last rank's slice ends in padding).
    shard: i64,
    /// Its parameters, in the order they are laid out.
    params: Vec<String>,
}

impl Layout {
    fn of(units: &[Unit], params: &[(String, Tensor)], world: usize) -> Layout {
        Layout {
            world,
            units: units
                .iter()
                .map(|u| SavedUnit {
                    name: u.name.clone(),
                    numel: u.numel,
                    shard: u.shard(world),
                    params: u
                        .members
                        .iter()
                        .map(|&(i, _, _)| params[i].0.clone())
                        .collect(),
                })
                .collect(),
        }
    }
}

/// Calls `place((unit, moment), start, values)` for every saved piece of AdamW's moments in the
/// checkpoint `ckpt` (moment 0 = `exp_avg`, 1 = `exp_avg_sq`; `values` flat, starting at element
/// `start` of the unit's layout); returns the saved step count.
fn read_pieces(
    ckpt: &Path,
    units: &[Unit],
    params: &[(String, Tensor)],
    mut place: impl FnMut((usize, usize), i64, Tensor) -> Result<()>,
) -> Result<u64> {
    let unit_index: HashMap<&str, usize> = units
        .iter()
        .enumerate()
        .map(|(k, u)| (u.name.as_str(), k))
        .collect();
    let moment = |key: &str| -> Option<(usize, String)> {
        if let Some(n) = key.strip_prefix("exp_avg/") {
            Some((0, n.to_string()))
        } else {
            key.strip_prefix("exp_avg_sq/").map(|n| (1, n.to_string()))
        }
    };
    let mut step = None;
    let sharded = ckpt.join("optimizer").join("layout.json");
    if sharded.is_file() {
        let layout: Layout = serde_json::from_str(
            &std::fs::read_to_string(&sharded)
                .with_context(|| format!("reading {}", sharded.display()))?,
        )
        .with_context(|| format!("{}: not an optimizer layout", sharded.display()))?;
        check_layout(&sharded, &layout, units, params)?;
        for r in 0..layout.world {
            let file = ckpt.join("optimizer").join(rank_file(r));
            temper_model::safetensors_io::for_each_tensor(&file, |key, t| {
                if key == "step" {
                    step = Some(t.int64_value(&[0]) as u64);
                    return Ok(());
                }
                let Some((which, unit)) = moment(&key) else {
                    return Ok(());
                };
                let Some(&k) = unit_index.get(unit.as_str()) else {
                    bail!("{}: `{key}` is no unit of this model", file.display());
                };
                let saved = &layout.units[k];
                let start = r as i64 * saved.shard;
                let len = (saved.numel - start).clamp(0, t.numel() as i64);
                place((k, which), start, t.reshape([-1]).narrow(0, 0, len))
            })?;
        }
    } else {
        let file = ckpt.join("optimizer.safetensors");
        let mut where_is: HashMap<&str, (usize, i64)> = HashMap::new();
        for (k, u) in units.iter().enumerate() {
            for &(i, off, _) in &u.members {
                where_is.insert(params[i].0.as_str(), (k, off));
            }
        }
        temper_model::safetensors_io::for_each_tensor(&file, |key, t| {
            if key == "step" {
                step = Some(t.int64_value(&[0]) as u64);
                return Ok(());
            }
            let Some((which, name)) = moment(&key) else {
                return Ok(());
            };
            // State of parameters this run does not train is not its state.
            let Some(&(k, off)) = where_is.get(name.as_str()) else {
                return Ok(());
            };
            place((k, which), off, t.reshape([-1]))
        })?;
    }
    step.with_context(|| format!("{}: the optimizer state has no `step`", ckpt.display()))
}

/// A saved layout must describe the same units (names, sizes, parameters) as this model's.
fn check_layout(
    path: &Path,
    layout: &Layout,
    units: &[Unit],
    params: &[(String, Tensor)],
) -> Result<()> {
    let now = Layout::of(units, params, layout.world);
    if layout.world == 0 || layout.units.len() != now.units.len() {
        bail!(
            "{}: {} units saved over {} ranks, this model has {}: not this model's optimizer state",
            path.display(),
            layout.units.len(),
            layout.world,
            now.units.len()
        );
    }
    for (saved, here) in layout.units.iter().zip(&now.units) {
        if saved.name != here.name || saved.numel != here.numel || saved.params != here.params {
            bail!(
                "{}: unit {} ({} elements) differs from this model's {} ({} elements): not this model's \
                 optimizer state",
                path.display(),
                saved.name,
                saved.numel,
                here.name,
                here.numel
            );
        }
        if saved.shard * (layout.world as i64) < saved.numel {
            bail!(
                "{}: unit {}: {} ranks of {} elements cannot hold {}",
                path.display(),
                saved.name,
                layout.world,
                saved.shard,
                saved.numel
            );
        }
    }
    Ok(())
}

/// Where the ranks' slices wait while rank 0 writes the checkpoint of `step` under `dir` (a
/// hidden `.tmp-` folder, removed with other leftovers after a crash).
pub(crate) fn staging_dir(dir: &Path, step: usize) -> PathBuf {
    dir.join(format!(".global_step_{step}.tmp-slices"))
}
