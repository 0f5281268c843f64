//! Tinker's sampling side: a snapshot of the weights (`save_weights_for_sampler`) that keeps
//! sampling what it was made from while training goes on, `sample` (tokens with the stop token
//! included, per-token logprobs, stop reason) and `compute_logprobs` (prompt logprobs).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::{Device, Tensor};
use temper_model::{position_ids_from_mask, CausalLm, ComputeKind, LoraConfig, Policy};
use temper_rollout::{Engine, EngineConfig, Request, Sample, SamplingParams};

/// Tinker's `SamplingParams`.
#[derive(Debug, Clone, PartialEq)]
pub struct TinkerSamplingParams {
    pub max_tokens: usize,
    pub temperature: f64,
    pub top_p: f64,
    /// -1 (or 0) = off.
    pub top_k: i64,
    /// Stop when one of these token ids is sampled (kept as the last token).
    pub stop_tokens: Vec<i64>,
    /// Stop when the decoded completion contains one of these.
    pub stop_strings: Vec<String>,
    /// Keep sampling past EOS (Tinker's `stop=[]`: "disables all stop tokens, including EOS").
    pub ignore_eos: bool,
    pub seed: Option<u64>,
}

impl Default for TinkerSamplingParams {
    fn default() -> Self {
        TinkerSamplingParams {
            max_tokens: 16,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            stop_tokens: vec![],
            stop_strings: vec![],
            ignore_eos: false,
            seed: None,
        }
    }
}

/// One sampled sequence, as Tinker returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledSequence {
    /// The completion's tokens, the stop token included.
    pub tokens: Vec<i64>,
    pub logprobs: Vec<f32>,
    /// `"stop"` or `"length"`.
    pub stop_reason: &'static str,
}

/// A frozen copy of a model's weights on disk and in memory, for sampling.
pub struct SamplingModel {
    policy: Policy,
    pub path: PathBuf,
}

impl SamplingModel {
    /// An HF folder (what `save_weights_for_sampler` writes), computing in f32.
    pub fn load(dir: &Path, device: Device) -> Result<SamplingModel> {
        Self::load_with(dir, device, ComputeKind::F32)
    }

    /// [`SamplingModel::load`] computing in `compute`.
    pub fn load_with(dir: &Path, device: Device, compute: ComputeKind) -> Result<SamplingModel> {
        let policy = Policy::load(dir, device, compute)
            .with_context(|| format!("loading sampler weights {}", dir.display()))?;
        Ok(SamplingModel {
            path: dir.to_path_buf(),
            policy,
        })
    }

    /// The base model in `base_dir` with LoRA adapters `lora` loaded from `adapter_dir` (PEFT's
    /// format). The engine merges them into the weights once per sampling call.
    pub fn with_adapter(
        base_dir: &Path,
        lora: &LoraConfig,
        adapter_dir: &Path,
        device: Device,
        compute: ComputeKind,
    ) -> Result<SamplingModel> {
        let mut policy = Policy::load(base_dir, device, compute)
            .with_context(|| format!("loading base model {}", base_dir.display()))?;
        policy.model.add_lora(lora)?;
        policy.model.load_lora_adapter(adapter_dir)?;
        Ok(SamplingModel {
            policy,
            path: adapter_dir.to_path_buf(),
        })
    }

    /// Replace the adapters by those in `adapter_dir` (same rank and targets): switching between
    /// snapshots of one LoRA model costs a few megabytes, not a model load.
    pub fn swap_adapter(&mut self, adapter_dir: &Path) -> Result<()> {
        self.policy.model.load_lora_adapter(adapter_dir)?;
        self.path = adapter_dir.to_path_buf();
        Ok(())
    }

    /// `num_samples` completions of `prompt`. With a seed, the same request gives the same tokens.
    pub fn sample(
        &self,
        prompt: &[i64],
        num_samples: usize,
        p: &TinkerSamplingParams,
    ) -> Result<Vec<SampledSequence>> {
        let mut out = self.sample_many(
            &[(prompt.to_vec(), num_samples, p.clone())],
            p.seed.unwrap_or(0),
        );
        out.remove(0)
    }

    /// Several sample requests `(prompt, num_samples, params)` in one batched engine call, each
    /// answered (or refused) on its own. `engine_seed` seeds the requests without a seed.
    pub fn sample_many(
        &self,
        requests: &[(Vec<i64>, usize, TinkerSamplingParams)],
        engine_seed: u64,
    ) -> Vec<Result<Vec<SampledSequence>>> {
        let mut results: Vec<Option<Result<Vec<SampledSequence>>>> =
            Vec::with_capacity(requests.len());
        let mut valid = vec![];
        let mut engine_requests = vec![];
        for (prompt, num_samples, p) in requests {
            match self.request(prompt, *num_samples, p) {
                Ok(r) => {
                    valid.push(results.len());
                    engine_requests.push(r);
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let p = &self.policy;
        let mut engine = Engine::new(&p.model, p.eos_ids.clone()).with_config(EngineConfig {
            seed: engine_seed,
            ..EngineConfig::default()
        });
        if let Some(t) = &p.tokenizer {
            engine = engine.with_decoder(t);
        }
        match engine.generate(&engine_requests, &mut |_| {}) {
            Ok(samples) => {
                let mut per: Vec<Vec<SampledSequence>> = valid.iter().map(|_| vec![]).collect();
                for s in samples {
                    per[s.request_index].push(sampled_sequence(s));
                }
                for (slot, seqs) in valid.iter().zip(per) {
                    results[*slot] = Some(Ok(seqs));
                }
            }
            Err(e) => {
                let msg = format!("{e:#}");
                for slot in &valid {
                    results[*slot] = Some(Err(anyhow::anyhow!(msg.clone())));
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every request answered"))
            .collect()
    }

    /// The engine request for one Tinker sample request, checked.
    fn request(
        &self,
        prompt: &[i64],
        num_samples: usize,
        p: &TinkerSamplingParams,
    ) -> Result<Request> {
        if !p.stop_strings.is_empty() && self.policy.tokenizer.is_none() {
            bail!(
                "stop strings need a tokenizer, and {} has none",
                self.path.display()
            );
        }
        engine_request(
            prompt,
            num_samples,
            p,
            self.policy.model.config().vocab_size,
        )
    }

    /// Tinker's `compute_logprobs` ([`prompt_logprobs`] of this snapshot).
    pub fn compute_logprobs(&self, tokens: &[i64]) -> Result<Vec<Option<f32>>> {
        prompt_logprobs(&self.policy.model, tokens)
    }
}

/// Tinker's `compute_logprobs` (and a sample's `prompt_logprobs`): per position of `tokens`,
/// log p(token | the tokens before it) under `model`, on its training forward; `None` for the
/// first.
pub fn prompt_logprobs(model: &CausalLm, tokens: &[i64]) -> Result<Vec<Option<f32>>> {
    crate::prompt_pass::check_prompt_ids(model, tokens)?;
    if tokens.len() < 2 {
        return Ok(tokens.iter().map(|_| None).collect());
    }
    let device = model.device();
    let x = Tensor::from_slice(tokens).unsqueeze(0).to(device);
    let mask = x.ones_like();
    let pos = position_ids_from_mask(&mask);
    let (lp, _) = tch::no_grad(|| {
        model
            .token_logprobs(&x, &mask, &pos, &x.roll([-1], [1]), 1.0)
            .into_parts()
    });
    let n = tokens.len() as i64 - 1;
    let v = Vec::<f32>::try_from(lp.get(0).narrow(0, 0, n).to(Device::Cpu))?;
    Ok(std::iter::once(None)
        .chain(v.into_iter().map(Some))
        .collect())
}

/// The rollout engine's request for a Tinker sample request (`num_samples` of `prompt` with `p`),
/// checked against a vocabulary of `vocab` ids: the one translation of Tinker's sampling
/// parameters, used by [`SamplingModel`] and by a server sampling on its own engine.
pub fn engine_request(
    prompt: &[i64],
    num_samples: usize,
    p: &TinkerSamplingParams,
    vocab: i64,
) -> Result<Request> {
    if prompt.is_empty() {
        bail!("prompt is empty");
    }
    if let Some((i, t)) = prompt
        .iter()
        .enumerate()
        .find(|(_, t)| **t < 0 || **t >= vocab)
    {
        bail!("prompt[{i}] = {t} is outside the vocabulary (0..{vocab})");
    }
    let params = SamplingParams {
        n: num_samples,
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: if p.top_k <= 0 { -1 } else { p.top_k },
        max_tokens: p.max_tokens,
        stop: p.stop_strings.clone(),
        stop_token_ids: p.stop_tokens.clone(),
        ignore_eos: p.ignore_eos,
        seed: p.seed,
        ..SamplingParams::default()
    };
    params.validate(Some(vocab as usize))?;
    Ok(Request {
        prompt_ids: prompt.to_vec(),
        params,
    })
}

/// An engine sample as Tinker returns it.
pub fn sampled_sequence(s: Sample) -> SampledSequence {
    SampledSequence {
        tokens: s.completion_ids,
        logprobs: s.completion_logprobs,
        stop_reason: s.finish.as_str(),
    }
}
