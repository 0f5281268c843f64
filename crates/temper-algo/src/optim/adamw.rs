//! `torch.optim.AdamW`, bitwise PyTorch's on the same inputs, in either of its two forms:
//! `fused = true`, PyTorch's fused kernel (`torch.optim.AdamW(fused=True)`, TRL's default
//! `adamw_torch_fused`): one multi-tensor call per step for every parameter; or `fused = false`,
//! the single-tensor loop (`foreach=False`, PyTorch's default on the CPU), op for op.
use anyhow::{bail, Context, Result};
use std::path::Path;
use tch::{Kind, Tensor};

/// AdamW over a fixed, named list of parameters (the model's trainable tensors, in order).
pub struct AdamW {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    /// PyTorch's fused kernel (`fused=True`) instead of the single-tensor loop.
    pub fused: bool,
    names: Vec<String>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// Steps taken (PyTorch keeps one per parameter; they are always equal here).
    step: u64,
    /// The fused kernel's per-parameter step counts (f32 0-dim tensors on each parameter's
    /// device, as PyTorch keeps them for `fused=True`); each equals `fused_steps_at` when that is
    /// `Some`, else they are refilled from `step` before the next fused step.
    fused_steps: Vec<Tensor>,
    fused_steps_at: Option<u64>,
}

impl AdamW {
    /// State for `params` (zeros, like PyTorch's lazy init at the first step), the single-tensor
    /// loop ([`AdamW::fused`] false) until told otherwise.
    pub fn new(
        params: &[(String, Tensor)],
        lr: f64,
        betas: (f64, f64),
        eps: f64,
        weight_decay: f64,
    ) -> Self {
        let zeros = |p: &Tensor| p.zeros_like().set_requires_grad(false);
        Self {
            lr,
            betas,
            eps,
            weight_decay,
            fused: false,
            names: params.iter().map(|(n, _)| n.clone()).collect(),
            exp_avg: params.iter().map(|(_, p)| zeros(p)).collect(),
            exp_avg_sq: params.iter().map(|(_, p)| zeros(p)).collect(),
            step: 0,
            fused_steps: params
                .iter()
                .map(|(_, p)| Tensor::zeros([], (Kind::Float, p.device())))
                .collect(),
            fused_steps_at: Some(0),
        }
    }

    /// The same optimizer with PyTorch's fused kernel on (`true`) or the single-tensor loop.
    pub fn with_fused(mut self, fused: bool) -> Self {
        self.fused = fused;
        self
    }

    pub fn steps_taken(&self) -> u64 {
        self.step
    }

    /// The names of the tensors it steps, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The first and second moments of the tensor `name` (sharing their storage: writing into
    /// them restores state), `None` for a name it does not step.
    pub fn moments(&self, name: &str) -> Option<(Tensor, Tensor)> {
        let i = self.names.iter().position(|n| n == name)?;
        Some((
            self.exp_avg[i].shallow_clone(),
            self.exp_avg_sq[i].shallow_clone(),
        ))
    }

    /// Sets the steps taken, for state restored through [`AdamW::moments`].
    pub fn restore_steps(&mut self, step: u64) {
        self.step = step;
        self.fused_steps_at = None;
    }

    /// One step with the gradients currently in `params` (a parameter without a gradient is
    /// skipped, as in PyTorch). `params` must be the list given to [`AdamW::new`], in order.
    pub fn step(&mut self, params: &[(String, Tensor)]) -> Result<()> {
        if params.len() != self.names.len() {
            bail!(
                "AdamW: {} parameters given, state has {}",
                params.len(),
                self.names.len()
            );
        }
        for (i, (name, _)) in params.iter().enumerate() {
            if *name != self.names[i] {
                bail!(
                    "AdamW: parameter {i} is `{name}`, state has `{}`",
                    self.names[i]
                );
            }
        }
        // With no gradient at all PyTorch steps nothing, its step counts included.
        if params.iter().all(|(_, p)| !p.grad().defined()) {
            return Ok(());
        }
        self.step += 1;
        if self.fused {
            self.fused_step(params)
        } else {
            self.loop_step(params)
        }
    }

    /// Every parameter with a gradient in one fused call per (device, dtype), as PyTorch groups
    /// them; a sparse gradient is made dense first.
    fn fused_step(&mut self, params: &[(String, Tensor)]) -> Result<()> {
        let grads: Vec<(usize, Tensor)> = params
            .iter()
            .enumerate()
            .map(|(i, (_, p))| (i, p.grad()))
            .filter(|(_, g)| g.defined())
            .map(|(i, g)| {
                let g = if g.is_sparse() {
                    g.to_dense(None, false)
                } else {
                    g
                };
                (i, g)
            })
            .collect();
        // The kernel increments each count it is given: they must hold the steps before this one.
        let before = self.step - 1;
        if self.fused_steps_at != Some(before) {
            for t in &mut self.fused_steps {
                let _ = t.fill_(before as f64);
            }
        }
        self.fused_steps_at = (grads.len() == params.len()).then_some(self.step);
        // PyTorch's grouping: one call per (device, dtype), each a list of (parameter, gradient).
        type Group<'g> = ((tch::Device, Kind), Vec<&'g (usize, Tensor)>);
        let mut groups: Vec<Group> = Vec::new();
        for pg in &grads {
            let p = &params[pg.0].1;
            let key = (p.device(), p.kind());
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, members)) => members.push(pg),
                None => groups.push((key, vec![pg])),
            }
        }
        fn pick<'a>(of: &'a [Tensor], members: &[&(usize, Tensor)]) -> Vec<&'a Tensor> {
            members.iter().map(|(i, _)| &of[*i]).collect()
        }
        for (_, members) in groups {
            let group = temper_kernels::optim::FusedAdamwGroup {
                params: members.iter().map(|(i, _)| &params[*i].1).collect(),
                grads: members.iter().map(|(_, g)| g).collect(),
                exp_avgs: pick(&self.exp_avg, &members),
                exp_avg_sqs: pick(&self.exp_avg_sq, &members),
                steps: pick(&self.fused_steps, &members),
            };
            temper_kernels::optim::fused_adamw(
                &group,
                self.lr,
                self.betas,
                self.weight_decay,
                self.eps,
            )?;
        }
        Ok(())
    }

    /// PyTorch's single-tensor loop, op for op.
    fn loop_step(&mut self, params: &[(String, Tensor)]) -> Result<()> {
        let (beta1, beta2) = self.betas;
        let lr = self.lr;
        let step = self.step as f64;
        let bias_correction1 = 1.0 - beta1.powf(step);
        let bias_correction2 = 1.0 - beta2.powf(step);
        let step_size = lr / bias_correction1;
        let bias_correction2_sqrt = bias_correction2.powf(0.5);
        tch::no_grad(|| -> Result<()> {
            for (i, (_, p)) in params.iter().enumerate() {
                let g = p.grad();
                if !g.defined() {
                    continue;
                }
                // A sparse gradient (an embedding's backward with nothing dense before it) is
                // never stepped as if it were dense.
                let g = if g.is_sparse() {
                    g.to_dense(None, false)
                } else {
                    g
                };
                // Every operation is elementwise, so a slice at a time gives the same bits while
                // the temporaries stay a slice's size, not a parameter's (an embedding is 113 MB).
                for (mut p, g, mut exp_avg, mut exp_avg_sq) in
                    slices(&[p, &g, &self.exp_avg[i], &self.exp_avg_sq[i]])
                {
                    if self.weight_decay != 0.0 {
                        let _ = p.f_mul_scalar_(1.0 - lr * self.weight_decay)?;
                    }
                    let _ = exp_avg.f_lerp_(&g, 1.0 - beta1)?;
                    // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2): tch's addcmul_
                    // has no `value`, so the scalar is folded into the first factor, which is
                    // exactly what the kernel computes first (`self + value * t1 * t2`).
                    let _ = exp_avg_sq.f_mul_scalar_(beta2)?;
                    let _ = exp_avg_sq.f_addcmul_(&g.f_mul_scalar(1.0 - beta2)?, &g)?;
                    let mut denom = exp_avg_sq.f_sqrt()?.f_div_scalar(bias_correction2_sqrt)?;
                    let _ = denom.f_add_scalar_(self.eps)?;
                    // param.addcdiv_(exp_avg, denom, value=-step_size), folded the same way.
                    let _ = p.f_addcdiv_(&exp_avg.f_mul_scalar(-step_size)?, &denom)?;
                }
            }
            Ok(())
        })
    }

    /// Writes the state (moments per parameter + step) as one safetensors file.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut named: Vec<(String, Tensor)> = Vec::new();
        for (i, n) in self.names.iter().enumerate() {
            named.push((format!("exp_avg/{n}"), self.exp_avg[i].shallow_clone()));
            named.push((
                format!("exp_avg_sq/{n}"),
                self.exp_avg_sq[i].shallow_clone(),
            ));
        }
        named.push(("step".into(), Tensor::from_slice(&[self.step as i64])));
        temper_model::safetensors_io::write_safetensors(path, &named)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Restores the state written by [`AdamW::save`] (the hyper-parameters come from the config).
    /// The file is read one tensor at a time: the moments are twice the model, and reading the
    /// file whole made resuming need that much again.
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let mut slots: std::collections::HashMap<String, &mut Tensor> = self
            .names
            .iter()
            .zip(self.exp_avg.iter_mut().zip(self.exp_avg_sq.iter_mut()))
            .flat_map(|(n, (m, v))| [(format!("exp_avg/{n}"), m), (format!("exp_avg_sq/{n}"), v)])
            .collect();
        let mut step = None;
        temper_model::safetensors_io::for_each_tensor(path, |key, src| {
            if key == "step" {
                step = Some(src.to_kind(Kind::Int64).int64_value(&[0]) as u64);
                return Ok(());
            }
            // Tensors of parameters this optimizer does not have are not its state.
            let Some(dst) = slots.remove(&key) else {
                return Ok(());
            };
            if src.size() != dst.size() {
                bail!(
                    "{}: `{key}` has shape {:?}, parameter has {:?}",
                    path.display(),
                    src.size(),
                    dst.size()
                );
            }
            tch::no_grad(|| dst.copy_(&src));
            Ok(())
        })?;
        let missing = |k: &str| anyhow::anyhow!("{}: optimizer state lacks `{k}`", path.display());
        if let Some(k) = slots.keys().min() {
            return Err(missing(k));
        }
        self.step = step.ok_or_else(|| missing("step"))?;
        self.fused_steps_at = None;
        Ok(())
    }
}

/// Elements per slice of a parameter in [`AdamW::step`]: 4 Mi f32 values, 16 MiB.
const STEP_SLICE: i64 = 4 << 20;

/// The same rows of `p`, its gradient and its two moments (all shaped alike), in slices along the
/// first dimension of at most [`STEP_SLICE`] elements (at least one row); views, so in-place
/// operations on them update the tensors.
fn slices(t: &[&Tensor; 4]) -> Vec<(Tensor, Tensor, Tensor, Tensor)> {
    let [p, g, m, v] = t;
    let size = p.size();
    if size.is_empty() || p.numel() as i64 <= STEP_SLICE {
        let c = |t: &Tensor| t.shallow_clone();
        return vec![(c(p), c(g), c(m), c(v))];
    }
    let row = (p.numel() as i64 / size[0]).max(1);
    let rows = (STEP_SLICE / row).max(1);
    (0..size[0])
        .step_by(rows as usize)
        .map(|start| {
            let len = rows.min(size[0] - start);
            let n = |t: &Tensor| t.narrow(0, start, len);
            (n(p), n(g), n(m), n(v))
        })
        .collect()
}
