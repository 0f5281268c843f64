//! A Tinker datum: the tokens the model reads and the per-position inputs of the loss.

use std::collections::BTreeMap;

use anyhow::{bail, Result};

use crate::provenance::{Provenance, Recorded};

/// One `loss_fn_inputs` value: Tinker's `TensorData` (int64 token ids or float32 values).
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    I64(Vec<i64>),
    F32(Vec<f32>),
}

impl TensorData {
    pub fn len(&self) -> usize {
        match self {
            TensorData::I64(v) => v.len(),
            TensorData::F32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// As f64 values (token ids are accepted where numbers are expected, as Tinker converts).
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            TensorData::I64(v) => v.iter().map(|x| *x as f64).collect(),
            TensorData::F32(v) => v.iter().map(|x| *x as f64).collect(),
        }
    }
}

/// `model_input` (the tokens the model reads; position t predicts `target_tokens[t]`) and the
/// loss inputs, each as long as `model_input`.
#[derive(Debug, Clone, PartialEq)]
pub struct Datum {
    pub model_input: Vec<i64>,
    pub loss_fn_inputs: BTreeMap<String, TensorData>,
    /// Where the tokens came from (Tinker's `model_input_spans` / `loss_fn_input_spans`).
    pub provenance: Option<Provenance>,
    /// What the sampler recorded for the targets, resolved from `provenance` against the
    /// server's records ([`crate::SequenceRecords::resolve`]); `stable_reinforce` needs it.
    pub recorded: Option<Recorded>,
    /// The fields given as (N, K) matrices (row-major), with their K: `cross_entropy` onto K
    /// targets per position (`target_tokens` and `weights`, distillation onto a teacher's top-k).
    /// A field not named here is (N,).
    pub widths: BTreeMap<String, usize>,
}

impl Datum {
    /// A datum without provenance.
    pub fn new(model_input: Vec<i64>, loss_fn_inputs: BTreeMap<String, TensorData>) -> Datum {
        Datum {
            model_input,
            loss_fn_inputs,
            provenance: None,
            recorded: None,
            widths: BTreeMap::new(),
        }
    }

    /// K of field `name` (1 for an (N,) field).
    pub fn width(&self, name: &str) -> usize {
        self.widths.get(name).copied().unwrap_or(1)
    }

    /// The checks of a loss that reads the sampler's records (`stable_reinforce`): the records
    /// are there and no target that is not a sampled token has a non-zero advantage (its
    /// gradient would have no recorded logprob to weigh it).
    pub fn validate_recorded(&self, index: usize, loss_fn: &str) -> Result<()> {
        let Some(recorded) = &self.recorded else {
            bail!(
                "datum {index}: loss_fn {loss_fn} needs provenance: sample with \
                 record_stability_info=True and attach the sequence ids \
                 (Datum.with_provenance)"
            );
        };
        if let Some(adv) = self
            .loss_fn_inputs
            .get("advantages")
            .map(TensorData::to_f64)
        {
            if let Some(t) = (0..adv.len()).find(|&t| adv[t] != 0.0 && !recorded.sampled[t]) {
                bail!(
                    "datum {index}: loss_fn_inputs.advantages[{t}] = {} but target {t} is not a \
                     sampled token (loss_fn {loss_fn} trains sampled tokens only)",
                    adv[t]
                );
            }
        }
        Ok(())
    }

    /// The checks a server answers with a user error: non-empty input, token ids in the
    /// vocabulary, `target_tokens` and every field `needs` present, integer targets, all of the
    /// input's length. `index` names the datum in the message.
    pub fn validate(&self, index: usize, vocab: i64, needs: &[&str]) -> Result<Vec<i64>> {
        let n = self.model_input.len();
        if n == 0 {
            bail!("datum {index}: model_input is empty");
        }
        if let Some((t, id)) = self
            .model_input
            .iter()
            .enumerate()
            .find(|(_, id)| **id < 0 || **id >= vocab)
        {
            bail!("datum {index}: model_input[{t}] = {id} is outside the vocabulary (0..{vocab})");
        }
        let targets = match self.loss_fn_inputs.get("target_tokens") {
            None => bail!("datum {index}: loss_fn_inputs.target_tokens is missing"),
            Some(TensorData::F32(_)) => {
                bail!("datum {index}: loss_fn_inputs.target_tokens must be int64 token ids")
            }
            Some(TensorData::I64(v)) => v.clone(),
        };
        for (name, value) in &self.loss_fn_inputs {
            let k = self.width(name);
            if value.len() != n * k {
                let shape = if k == 1 {
                    String::new()
                } else {
                    format!(" ({n} x {k} expected)")
                };
                bail!(
                    "datum {index}: loss_fn_inputs.{name} has {} values, model_input has {n} tokens{shape}",
                    value.len()
                );
            }
        }
        let k = self.width("target_tokens");
        if k > 1 {
            if needs != ["weights"] {
                bail!(
                    "datum {index}: loss_fn_inputs.target_tokens is ({n}, {k}): only cross_entropy \
                     takes K targets per position"
                );
            }
            if self.loss_fn_inputs.contains_key("weights") && self.width("weights") != k {
                bail!(
                    "datum {index}: loss_fn_inputs.weights must be ({n}, {k}) like target_tokens, \
                     it is ({n}, {})",
                    self.width("weights")
                );
            }
        }
        if let Some((t, id)) = targets
            .iter()
            .enumerate()
            .find(|(_, id)| **id < 0 || **id >= vocab)
        {
            bail!(
                "datum {index}: loss_fn_inputs.target_tokens[{t}] = {id} is outside the vocabulary (0..{vocab})"
            );
        }
        for field in needs {
            if !self.loss_fn_inputs.contains_key(*field) {
                bail!("datum {index}: loss_fn_inputs.{field} is missing (the loss needs it)");
            }
        }
        // gspo's sequence ratio is a mean over the marked positions: none marked has no ratio.
        let ratio_mask = temper_algo::tinker_loss::SEQUENCE_RATIO_MASK;
        if needs.contains(&ratio_mask)
            && self.loss_fn_inputs[ratio_mask]
                .to_f64()
                .iter()
                .all(|&x| x == 0.0)
        {
            bail!("datum {index}: loss_fn_inputs.{ratio_mask} marks no position (gspo's sequence ratio averages over the marked ones)");
        }
        Ok(targets)
    }
}
