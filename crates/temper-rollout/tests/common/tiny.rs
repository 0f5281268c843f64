//! The tiny random Llama and the transformers reference numbers of `rollout_reference.py fixtures`.

use std::path::PathBuf;
use std::sync::OnceLock;

use serde::Deserialize;
use tch::Device;
use temper_model::{CausalLm, ComputeKind};

#[derive(Deserialize)]
pub struct Reference {
    pub prompts: Vec<Vec<i64>>,
    /// Greedy, 16 new tokens, no EOS.
    pub free16: Vec<Vec<i64>>,
    pub greedy_eos: GreedyEos,
    pub greedy_penalty_min: GreedyPenaltyMin,
    pub next_probs: Vec<NextProbs>,
    pub processors: Processors,
}

#[derive(Deserialize)]
pub struct GreedyEos {
    pub eos: i64,
    pub max_new: usize,
    pub completions: Vec<Vec<i64>>,
    /// log_softmax of transformers' generate scores at the chosen tokens.
    pub logprobs: Vec<Vec<f64>>,
}

#[derive(Deserialize)]
pub struct GreedyPenaltyMin {
    pub eos: i64,
    pub max_new: usize,
    pub repetition_penalty: f64,
    pub min_new_tokens: usize,
    pub completions: Vec<Vec<i64>>,
    pub without_penalty: Vec<Vec<i64>>,
}

#[derive(Deserialize)]
pub struct NextProbs {
    pub prompt_index: usize,
    pub temperature: f64,
    pub top_k: i64,
    pub top_p: f64,
    pub probs: Vec<f64>,
}

#[derive(Deserialize)]
pub struct Processors {
    pub logits: Vec<Vec<f32>>,
    pub rows: Vec<ProcessorRow>,
    /// None = removed (-inf).
    pub processed: Vec<Vec<Option<f64>>>,
}

#[derive(Deserialize)]
pub struct ProcessorRow {
    pub temperature: f64,
    pub top_k: i64,
    pub top_p: f64,
    pub repetition_penalty: f64,
    pub seen: Vec<i64>,
    pub banned: Vec<i64>,
}

fn fixtures() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| super::reference_output(&["fixtures"], None))
}

pub fn reference() -> &'static Reference {
    static REF: OnceLock<Reference> = OnceLock::new();
    REF.get_or_init(|| {
        let text = std::fs::read_to_string(fixtures().join("reference.json")).unwrap();
        serde_json::from_str(&text).expect("reference.json")
    })
}

pub fn tiny_dir() -> PathBuf {
    fixtures().join("tiny")
}

pub fn tiny_model() -> CausalLm {
    CausalLm::load(&tiny_dir(), Device::Cpu, ComputeKind::F32).expect("load the tiny model")
}
