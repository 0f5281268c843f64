//! A Tinker datum: the tokens the model reads and the per-position inputs of the loss.

use std::collections::BTreeMap;

use anyhow::{bail, Result};

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
}

impl Datum {
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
            if value.len() != n {
                bail!(
                    "datum {index}: loss_fn_inputs.{name} has {} values, model_input has {n} tokens",
                    value.len()
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
        Ok(targets)
    }
}
