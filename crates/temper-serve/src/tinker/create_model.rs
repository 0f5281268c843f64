//! `/api/v1/create_model`: a training model (LoRA or full) on its own thread, built from a base
//! model or a saved state; the future completes when the model is ready.
use std::path::PathBuf;
use std::sync::{mpsc, Arc};

use anyhow::{anyhow, bail, Context, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Value};
use temper_model::{CausalLm, LoraConfig, ModelConfig};
use temper_tinker::TrainingModel;

use super::futures::Outcome;
use super::routes::{future, live_session, parse_json};
use super::training::{self, ModelInfo, Queued};
use super::{ModelHandle, Tinker};
use crate::AppState;

type S = State<Arc<AppState>>;

/// What a new training model is made from.
pub(super) struct Spec {
    pub(super) model_id: String,
    pub(super) base_model: String,
    pub(super) base_dir: PathBuf,
    pub(super) lora: Option<LoraConfig>,
    pub(super) seed: Option<u64>,
    /// A saved state to start from, and whether with its optimizer state.
    pub(super) state: Option<(PathBuf, bool)>,
    /// The answer's `type`: `create_model`, or `load_weights` for a model made from a state.
    pub(super) answer_type: &'static str,
}

/// LoRA from Tinker's `lora_config` (rank, train_attn, train_mlp, train_unembed, each true by
/// default); alpha = rank (scale 1).
fn lora_from(v: &Value) -> Result<Option<LoraConfig>> {
    let rank = match &v["rank"] {
        Value::Null => 32,
        r => r.as_i64().context("lora_config.rank: not an integer")?,
    };
    if rank == 0 {
        return Ok(None);
    }
    let on = |k: &str| v[k].as_bool().unwrap_or(true);
    let mut targets = vec![];
    if on("train_attn") {
        targets.extend(["q_proj", "k_proj", "v_proj", "o_proj"]);
    }
    if on("train_mlp") {
        targets.extend(["gate_proj", "up_proj", "down_proj"]);
    }
    if on("train_unembed") {
        targets.push(temper_model::LORA_HEAD);
    }
    if targets.is_empty() {
        bail!(
            "lora_config: train_attn, train_mlp and train_unembed are all false: nothing to train"
        );
    }
    let cfg = LoraConfig {
        rank,
        alpha: rank as f64,
        target_modules: targets.into_iter().map(str::to_string).collect(),
    };
    cfg.targets().context("lora_config")?;
    Ok(Some(cfg))
}

/// Starts the model's thread: it loads the model, answers `created`, then runs the queue.
pub(super) fn start_model(t: &Arc<Tinker>, spec: Spec, created: super::futures::Promise) {
    let (tx, rx) = mpsc::channel::<Queued>();
    let info = json!({
        "model_id": spec.model_id, "type": "get_info", "is_lora": spec.lora.is_some(),
        "lora_rank": spec.lora.as_ref().map(|c| c.rank), "model_name": spec.base_model,
        "model_data": {"arch": "causal_lm", "model_name": spec.base_model,
                       "tokenizer_id": spec.base_dir.display().to_string()},
    });
    t.models.lock().unwrap_or_else(|e| e.into_inner()).insert(
        spec.model_id.clone(),
        ModelHandle {
            tx,
            info,
            base_model: spec.base_model.clone(),
        },
    );
    let samplers = t.samplers.clone();
    let bases = t.bases.clone();
    let (device, compute) = (t.device, t.compute);
    let dir = t.root.join(&spec.model_id);
    let name = format!("tinker-{}", spec.model_id);
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let built = (|| -> Result<TrainingModel> {
            let base = || format!("base_model {:?}", spec.base_model);
            if device == tch::Device::Cpu {
                let config = ModelConfig::from_file(&spec.base_dir.join("config.json"))
                    .with_context(base)?;
                let shared = bases.is_loaded(&spec.base_dir, device, compute);
                super::admission::admit(&config, spec.lora.as_ref(), shared)?;
            }
            // LoRA clients of one base share its weights; a full fine-tune owns its copy.
            let model = match &spec.lora {
                Some(cfg) => bases
                    .get(&spec.base_dir, device, compute)
                    .with_context(base)?
                    .lora_model(cfg, spec.seed, compute)?,
                None => CausalLm::load(&spec.base_dir, device, compute).with_context(base)?,
            };
            let mut tm = TrainingModel::new(model);
            if let Some((dir, optimizer)) = &spec.state {
                tm.load_state(dir, *optimizer)?;
            }
            Ok(tm)
        })();
        let tm = match built {
            Ok(tm) => tm,
            Err(e) => return created.complete(Outcome::user_error(format!("{e:#}"))),
        };
        let model_id = spec.model_id.clone();
        created.complete(Outcome::Json(
            json!({"model_id": model_id, "type": spec.answer_type}),
        ));
        let info = ModelInfo {
            model_id: spec.model_id,
            base_model: spec.base_model,
            base_dir: spec.base_dir,
            dir,
        };
        training::run(tm, info, samplers, rx);
        // The model, its gradients and optimizer state are gone: give their pages back.
        temper_kernels::memory::release_free_memory();
    });
    if let Err(e) = spawned {
        eprintln!("temper serve: could not start a model thread: {e}");
    }
}

pub(super) async fn create_model(State(state): S, body: Bytes) -> Response {
    let t = state.tinker.clone();
    let tb = t.clone();
    let prepared = tokio::task::spawn_blocking(move || -> Result<Spec> {
        let v = parse_json(&body)?;
        let session = live_session(&tb, &v)?;
        let seq = v["model_seq_id"]
            .as_i64()
            .context("model_seq_id: missing")?;
        let base_model = v["base_model"]
            .as_str()
            .context("base_model: missing")?
            .to_string();
        if v["optimizer_config"]["type"]
            .as_str()
            .is_some_and(|k| k != "adamw")
        {
            bail!("optimizer_config.type: only adamw is supported");
        }
        let base_dir = temper_model::resolve::resolve_model(&base_model)
            .with_context(|| format!("base_model {base_model:?}"))?;
        Ok(Spec {
            model_id: format!("{session}:train:{seq}"),
            base_model,
            base_dir: std::fs::canonicalize(&base_dir).unwrap_or(base_dir),
            lora: lora_from(&v["lora_config"])?,
            seed: v["lora_config"]["seed"].as_u64(),
            state: None,
            answer_type: "create_model",
        })
    })
    .await
    .map_err(|e| anyhow!("{e}"))
    .and_then(|r| r);
    future(&state, json!({}), || {
        let spec = prepared?;
        Ok(Box::new(move |promise| start_model(&t, spec, promise)))
    })
}
