//! verl's learning-rate schedules (`verl/utils/torch_functional.py`), indexed by optimizer step
//! from 0: linear warmup, then constant or cosine decay to `min_lr_ratio`.
use anyhow::Result;

temper_algo::named_enum! {
    /// `actor.optim.lr_scheduler_type` (verl's `warmup_style` is another name for the key).
    pub enum ScheduleKind ("lr_scheduler_type") {
        Constant => "constant",
        Cosine => "cosine",
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LrSchedule {
    pub base_lr: f64,
    pub kind: ScheduleKind,
    pub warmup_steps: usize,
    pub total_steps: usize,
    pub min_lr_ratio: f64,
    pub num_cycles: f64,
}

impl LrSchedule {
    /// verl's resolution of the warmup length: `lr_warmup_steps` when >= 0, else
    /// `int(lr_warmup_steps_ratio * total_steps)`.
    pub fn from_optim(o: &crate::config::OptimConfig, total_steps: usize) -> Result<Self> {
        let kind = o.lr_scheduler_type;
        let warmup_steps = if o.lr_warmup_steps >= 0 {
            o.lr_warmup_steps as usize
        } else {
            (o.lr_warmup_steps_ratio * total_steps as f64) as usize
        };
        Ok(Self {
            base_lr: o.lr,
            kind,
            warmup_steps,
            total_steps,
            min_lr_ratio: o.min_lr_ratio,
            num_cycles: o.num_cycles,
        })
    }

    /// The multiplier of the base lr at optimizer step `step` (0-based), as verl's `lr_lambda`.
    pub fn factor(&self, step: usize) -> f64 {
        let (s, w) = (step as f64, self.warmup_steps as f64);
        match self.kind {
            ScheduleKind::Constant => {
                if step < self.warmup_steps {
                    s / w.max(1.0)
                } else {
                    1.0
                }
            }
            ScheduleKind::Cosine => {
                if step < self.warmup_steps {
                    return s / w.max(1.0);
                }
                let coef = (1.0 - self.min_lr_ratio) * 0.5;
                let intercept = (1.0 + self.min_lr_ratio) * 0.5;
                let denom = (self.total_steps as f64 - w).max(1.0);
                let progress = (s - w) / denom;
                let x = (std::f64::consts::PI * self.num_cycles * 2.0 * progress).cos();
                self.min_lr_ratio.max(x * coef + intercept)
            }
        }
    }

    pub fn lr(&self, step: usize) -> f64 {
        self.base_lr * self.factor(step)
    }
}
