//! The policy update of a step: `actor.ppo_epochs` passes over the mini-batches, each a sum of
//! micro-batch forward/backward passes (this rank's share when data-parallel), then the gradients
//! summed over ranks, clipped, and one AdamW step.
use std::collections::BTreeMap;

use anyhow::{bail, Result};
use tch::{Kind, Tensor};

use super::partition::{MiniBatch, Partition};
use super::Learner;
use crate::dist::Dist;
use crate::trainer::batch::Batch;
use crate::trainer::stats::{DeviceMetricAcc, StepMetrics};

/// What one policy update trains on: every tensor (N, R) f32 over the batch's rows.
pub(super) struct UpdateInputs<'a> {
    pub batch: &'a Batch,
    pub partition: &'a Partition,
    /// The first epoch's mini-batches, those the old log-probs were computed on (later epochs
    /// are reshuffled by `partition`).
    pub first: Vec<MiniBatch>,
    /// `None`: the first update records its own detached log-probs as the old ones.
    pub old: Option<&'a Tensor>,
    pub reference: Option<&'a Tensor>,
    pub advantages: &'a Tensor,
    /// The loss mask (the response mask less rejected tokens, or less injected ones).
    pub response_mask: &'a Tensor,
    pub is_weights: Option<&'a Tensor>,
    pub lr: f64,
}

impl Learner {
    /// Runs the update (gradients summed over `dist`'s ranks) and adds its `actor/*` metrics to
    /// `m`; returns the recorded old log-probs when `input.old` was `None`.
    pub(super) fn update(
        &mut self,
        dist: &Dist,
        step: usize,
        input: UpdateInputs,
        m: &mut StepMetrics,
    ) -> Result<Option<Tensor>> {
        let UpdateInputs {
            batch,
            partition,
            first,
            old,
            reference,
            advantages,
            response_mask,
            is_weights,
            lr,
        } = input;
        const ADDITIVE: [&str; 3] = ["actor/pg_loss", "actor/entropy", "actor/kl_loss"];
        let temperature = self.settings.temperature;
        // Without precomputed old log-probs, the first update's own (detached) ones are recorded.
        let mut recorded = Tensor::zeros(
            [batch.rows as i64, batch.response_len],
            (Kind::Float, self.model.device()),
        );
        let started = std::time::Instant::now();
        // The model FLOPs of this rank's passes (`temper_model::roof`'s convention).
        let mut flops = 0.0;
        let full = self.model.lora_config().is_none();
        // Read once, after the loop: no host sync per micro-batch for the metrics.
        let mut acc = DeviceMetricAcc::default();
        let mut grad_norms = Vec::new();
        let mut skipped = 0;
        let mut first = Some(first);
        // A sharded optimizer gathers each decoder layer only while it runs when the layers are
        // checkpointed (their backward runs layer by layer).
        let per_layer = self.settings.actor.gradient_checkpointing;
        self.optimizer.begin_update(per_layer)?;
        // The most this rank held for the trainable weights (`perf/trainable_state_gb`).
        let mut held = 0i64;
        for epoch in 0..self.settings.actor.ppo_epochs {
            let parts = match first.take() {
                Some(p) => p,
                None => partition.parts(epoch),
            };
            for (mb_i, mb) in parts.iter().enumerate() {
                // Layers gathered per use: a rank with a micro-batch fewer than another (an
                // environment's datums split unevenly) sweeps the layers for it all the same.
                let idle = crate::trainer::batch::idle_micro_batches(
                    dist,
                    mb.mine.len(),
                    per_layer && self.optimizer.is_sharded(),
                )?;
                // With checkpointing the forward holds only each layer's input, so gradients
                // allocated first cost nothing at the peak and keep the backward's temporaries
                // from leaving holes between them (see the function). Without it the forward's
                // activations are freed as the gradients come, and allocating these first would
                // add the two (today's shape: +400 MiB).
                // (A sharded update allocates each layer's gradients as its backward runs and
                // frees them as it leaves: none are allocated ahead.)
                if self.settings.actor.gradient_checkpointing && !self.optimizer.is_sharded() {
                    temper_kernels::zero_grads_if_missing(&self.params)?;
                }
                let mut backward_ran = false;
                // The loss normalises by the whole mini-batch (every rank's rows).
                let ctx = self.loss_cfg.context(&[&mb.all.of(response_mask)])?;
                let masks: Vec<Tensor> = mb.mine.iter().map(|idx| idx.of(response_mask)).collect();
                let mut additive: BTreeMap<&'static str, Tensor> = BTreeMap::new();
                for (idx, mask) in mb.mine.iter().zip(&masks) {
                    let (positions, scored) = batch.forward_positions(idx);
                    flops += self.model.config().training_flops(positions, scored, full);
                    let scores = batch.response_scores(
                        &self.model,
                        idx,
                        temperature,
                        self.unembed_chunk(),
                        self.settings.actor.gradient_checkpointing,
                    )?;
                    let logp = scores.logp.shallow_clone();
                    let ent = if self.loss_cfg.entropy_coeff != 0.0 {
                        scores.entropy.shallow_clone()
                    } else {
                        scores.entropy.detach()
                    };
                    let old_mb = match old {
                        Some(o) => idx.of(o),
                        None => {
                            let d = logp.detach();
                            let _ = recorded.index_copy_(0, idx.on_device(), &d);
                            d
                        }
                    };
                    let adv_mb = idx.of(advantages);
                    let ref_mb = reference.map(|r| idx.of(r));
                    let w_mb = is_weights.map(|w| idx.of(w));
                    let out = temper_algo::actor_loss(
                        &self.loss_cfg,
                        &temper_algo::ActorLossInput {
                            log_prob: &logp,
                            old_log_prob: Some(&old_mb),
                            ref_log_prob: ref_mb.as_ref(),
                            advantages: &adv_mb,
                            response_mask: mask,
                            entropy: Some(&ent),
                            rollout_is_weights: w_mb.as_ref(),
                        },
                        &ctx,
                    )?;
                    if self.settings.check_on_policy && epoch == 0 && mb_i == 0 {
                        let valid = idx.of(&batch.response_mask);
                        check_reproduces(step, &logp, &old_mb, &valid)?;
                    }
                    // A loss without a graph (no token left to train on) adds no gradient;
                    // with layers gathered per use its scores still run the backward's sweep
                    // over the layers (computing nothing), as every rank must.
                    if out.loss.requires_grad() {
                        out.loss.backward();
                        scores.backward();
                        backward_ran = true;
                    } else if per_layer {
                        scores.backward();
                    }
                    self.optimizer.check()?;
                    held = held.max(self.optimizer.peak_held_bytes(&self.params));
                    let tokens = mask.sum(Kind::Double);
                    for (k, v) in out.metrics.iter() {
                        if ADDITIVE.contains(&k) {
                            let sum = match additive.remove(k) {
                                Some(s) => s + v,
                                None => v + 0.0,
                            };
                            additive.insert(k, sum);
                        } else {
                            acc.add(k, v, &tokens);
                        }
                    }
                }
                for _ in 0..idle {
                    self.model
                        .sweep_idle_micro_batch(batch.forward_sweeps(), true);
                }
                self.optimizer.check()?;
                for (k, v) in additive {
                    acc.add(k, &v, &Tensor::from(1.0f64));
                }
                // Without any backward the gradients are dropped again, so the optimizer skips
                // every parameter as PyTorch's does with no gradients (data-parallel ranks then
                // send zeros, as before).
                if !backward_ran {
                    temper_kernels::clear_grads(&self.params)?;
                }
                let stepped = self.optimizer.reduce_grads(dist, &self.params)?;
                let norm = match stepped {
                    true => self
                        .optimizer
                        .clip_grad_norm(&self.params, self.settings.actor.grad_clip)?,
                    // Nothing to step on any rank: PyTorch's optimizer takes no step.
                    false => 0.0,
                };
                grad_norms.push(norm);
                if !norm.is_finite() {
                    eprintln!(
                        "warning: step {step}: grad norm is {norm}; skipping this optimizer step"
                    );
                    self.optimizer.skip_step();
                    skipped += 1;
                } else if stepped {
                    self.optimizer.step(&self.params, lr)?;
                }
                temper_kernels::clear_grads(&self.params)?;
            }
        }
        self.optimizer.end_update()?;
        let mut acc = acc.read();
        acc.all_reduce(dist, &ADDITIVE)?;
        acc.finish(m);
        let finite: Vec<f64> = grad_norms
            .iter()
            .copied()
            .filter(|g| g.is_finite())
            .collect();
        m.insert(
            "actor/grad_norm".into(),
            if finite.is_empty() {
                f64::NAN
            } else {
                finite.iter().sum::<f64>() / finite.len() as f64
            },
        );
        m.insert(
            "actor/optimizer_steps".into(),
            (grad_norms.len() - skipped) as f64,
        );
        m.insert("actor/nonfinite_grad_steps".into(), skipped as f64);
        let achieved = flops / started.elapsed().as_secs_f64().max(1e-9);
        m.insert("perf/update_tflops".into(), achieved / 1e12);
        m.insert(
            "perf/trainable_state_gb".into(),
            held as f64 / (1u64 << 30) as f64,
        );
        m.insert(
            "perf/update_roof_fraction".into(),
            achieved / self.roof.matmul_flops,
        );
        if old.is_some() {
            return Ok(None);
        }
        // Each rank recorded its own rows.
        dist.sum_tensor(&recorded)?;
        Ok(Some(recorded))
    }
}

/// `trainer.check_on_policy`: the first mini-batch's training forward (weights not yet updated)
/// must reproduce the separate no-grad old-logprob pass bitwise on every valid token.
fn check_reproduces(step: usize, logp: &Tensor, old: &Tensor, valid: &Tensor) -> Result<()> {
    let valid = valid.gt(0.0);
    let logp = logp.detach().masked_select(&valid);
    let old = old.masked_select(&valid);
    let differ = logp.ne_tensor(&old).sum(Kind::Int64).int64_value(&[]);
    if differ > 0 {
        let max = (&logp - &old).abs().max().double_value(&[]);
        bail!(
            "trainer.check_on_policy: step {step}, first update: the training forward differs from the old-logprob \
             pass on {differ} of {} tokens (max |diff| {max:e}); expected bitwise equality (same weights, same \
             micro-batches); see docs/training.md for the settings that guarantee it",
            logp.numel()
        );
    }
    Ok(())
}
