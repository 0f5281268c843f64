//! Sampling sessions: each names a weights folder (a snapshot written by
//! save_weights_for_sampler, or a base model) and keeps sampling those weights while training
//! goes on. The sampling itself runs on the serving worker with every other API's requests
//! ([`crate::worker`]): LoRA snapshots of the served model are its adapters attached to the one
//! copy of it; other folders are loaded there, the few most recently used kept.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use prost::Message;
use temper_tinker::SampledSequence;

use super::futures::Outcome;
use super::proto;
use crate::worker::Pruner;

/// A sampling session: what it samples.
#[derive(Clone, Debug)]
pub struct Session {
    pub dir: PathBuf,
    pub base_model: String,
    /// `tinker://...` when made from saved sampler weights.
    pub model_path: Option<String>,
    /// For an inflight sampling client (`kind="inflight"`), the training model whose latest
    /// inflight save it samples.
    pub inflight_of: Option<String>,
}

/// The sampling sessions, and the worker to tell when their weights are no longer needed;
/// cheap to clone.
#[derive(Clone)]
pub struct Samplers {
    sessions: Arc<Mutex<HashMap<String, Session>>>,
    pruner: Pruner,
}

impl Samplers {
    pub fn new(pruner: Pruner) -> Samplers {
        Samplers {
            sessions: Arc::default(),
            pruner,
        }
    }

    /// Forgets the sampling sessions whose ids start with `prefix` (an ended client session's),
    /// and has the worker unload the weights that no remaining session samples.
    pub fn forget(&self, prefix: &str) {
        let keep = {
            let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            sessions.retain(|id, _| !id.starts_with(prefix));
            sessions.values().map(|s| s.dir.clone()).collect()
        };
        self.pruner.prune(keep);
    }

    pub fn register(&self, id: &str, dir: &Path, base_model: &str, model_path: Option<&str>) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                id.to_string(),
                Session {
                    dir: dir.to_path_buf(),
                    base_model: base_model.to_string(),
                    model_path: model_path.map(str::to_string),
                    inflight_of: None,
                },
            );
    }

    /// An inflight sampling client of training model `model_id` (the SDK's
    /// `SamplingClientKind` contract): it and every earlier inflight client of that model now
    /// sample the weights just saved in `dir`; the weights no session samples any more are
    /// unloaded.
    pub fn register_inflight(
        &self,
        id: &str,
        dir: &Path,
        base_model: &str,
        model_path: &str,
        model_id: &str,
    ) {
        let keep = {
            let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            for s in sessions.values_mut() {
                if s.inflight_of.as_deref() == Some(model_id) {
                    s.dir = dir.to_path_buf();
                    s.model_path = Some(model_path.to_string());
                }
            }
            sessions.insert(
                id.to_string(),
                Session {
                    dir: dir.to_path_buf(),
                    base_model: base_model.to_string(),
                    model_path: Some(model_path.to_string()),
                    inflight_of: Some(model_id.to_string()),
                },
            );
            sessions.values().map(|s| s.dir.clone()).collect()
        };
        self.pruner.prune(keep);
    }

    pub fn session(&self, id: &str) -> Option<Session> {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }
}

/// What an `asample` answer says about the prompt (each `None` when not asked).
#[derive(Default)]
pub struct PromptAnswers {
    pub logprobs: Option<Vec<u8>>,
    pub topk: Option<proto::TopkLogprobs>,
    pub targets: Option<proto::Tensor>,
    pub alt_tokens: Option<proto::PromptAltTokens>,
}

/// The `asample` result: the sequences (each with its sampled positions' top-k when asked) and
/// the prompt's answers, as Tinker's protobuf.
pub fn sample_response(
    seqs: Vec<(SampledSequence, Option<proto::TopkLogprobs>)>,
    prompt: PromptAnswers,
) -> Outcome {
    let response = proto::SampleResponse {
        sequences: seqs
            .into_iter()
            .map(|(s, topk)| proto::SampledSequence {
                stop_reason: match s.stop_reason {
                    "length" => proto::StopReason::Length as i32,
                    _ => proto::StopReason::Stop as i32,
                },
                tokens: proto::i32_bytes(s.tokens.iter().copied()),
                logprobs: Some(proto::f32_bytes(s.logprobs.iter().copied())),
                topk_sampled_logprobs: topk,
            })
            .collect(),
        prompt_logprobs: prompt.logprobs,
        topk_prompt_logprobs: prompt.topk,
        prompt_cache_hit_tokens: 0,
        target_prompt_logprobs: prompt.targets,
        prompt_alt_tokens: prompt.alt_tokens,
    };
    Outcome::Proto(response.encode_to_vec())
}
