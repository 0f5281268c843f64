//! Weights pushed over a c10d group instead of a folder, in SGLang's protocol (what verl, slime
//! and temper's trainer call with `rollout.weight_sync = "distributed"`):
//! `POST /init_weights_update_group {master_address, master_port, rank_offset, world_size,
//! group_name, backend}` joins a process group whose rank 0 is the trainer (it hosts the
//! TCPStore); `POST /update_weights_from_distributed {names, dtypes, shapes, group_name}` then
//! receives each named tensor by a broadcast from rank 0, in order, while the trainer sends them,
//! and copies it into the served model; `POST /destroy_weights_update_group {group_name}` leaves.
//! As with a reload from disk, the worker takes the weights between batches: requests queued
//! before are sampled with the old weights, those after with the new.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};
use temper_kernels::{Backend, Comm, Rendezvous};
use temper_model::CausalLm;

use crate::reply::{bad, handle};
use crate::AppState;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/init_weights_update_group", post(init))
        .route("/update_weights_from_distributed", post(update))
        .route("/destroy_weights_update_group", post(destroy))
}

fn default_group() -> String {
    "weight_update_group".into()
}

fn default_backend() -> String {
    "nccl".into()
}

/// SGLang's `InitWeightsUpdateGroupReqInput`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InitRequest {
    master_address: String,
    master_port: u16,
    rank_offset: usize,
    world_size: usize,
    #[serde(default = "default_group")]
    group_name: String,
    #[serde(default = "default_backend")]
    backend: String,
}

/// SGLang's `UpdateWeightsFromDistributedReqInput` (the fields temper acts on, and those it
/// accepts as SGLang does: the cache is never kept across weights here).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateRequest {
    names: Vec<String>,
    dtypes: Vec<String>,
    shapes: Vec<Vec<i64>>,
    #[serde(default = "default_group")]
    group_name: String,
    #[serde(default)]
    weight_version: Option<String>,
    #[serde(default, rename = "flush_cache")]
    _flush_cache: Option<bool>,
    #[serde(default, rename = "abort_all_requests")]
    _abort_all_requests: Option<bool>,
    #[serde(default, rename = "load_format")]
    _load_format: Option<String>,
    #[serde(default, rename = "torch_empty_cache")]
    _torch_empty_cache: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DestroyRequest {
    #[serde(default = "default_group")]
    group_name: String,
}

/// The most ranks a weight group may have (a bound on what a request makes the server wait
/// for, not a limit anyone meets: one trainer rank and its servers).
const MAX_WORLD: usize = 4096;

/// One group to join: checked, with the backend resolved.
pub(crate) struct Join {
    pub name: String,
    pub rendezvous: Rendezvous,
}

/// The tensors one update receives, in order, checked against the served model by the worker.
pub(crate) struct Incoming {
    pub group: String,
    pub tensors: Vec<(String, Kind, Vec<i64>)>,
}

fn join_request(r: InitRequest) -> Result<Join, String> {
    let timeout = temper_kernels::collective_timeout_from_env().map_err(|e| format!("{e:#}"))?;
    if r.master_address.trim().is_empty() {
        return Err("master_address: empty".into());
    }
    if r.master_port == 0 {
        return Err("master_port: 0 is not a port".into());
    }
    if !(2..=MAX_WORLD).contains(&r.world_size) {
        return Err(format!(
            "world_size: {} (expected 2 to {MAX_WORLD}: the trainer's rank 0 and the servers)",
            r.world_size
        ));
    }
    if r.rank_offset == 0 || r.rank_offset >= r.world_size {
        return Err(format!(
            "rank_offset: {} (expected 1 to {}: rank 0 is the trainer's)",
            r.rank_offset,
            r.world_size - 1
        ));
    }
    let backend = match r.backend.as_str() {
        "gloo" => Backend::Gloo,
        // The served model's device is checked by the worker, which knows it.
        "nccl" => Backend::Nccl { device: 0 },
        other => {
            return Err(format!(
                "backend: {other:?} (expected \"nccl\" or \"gloo\")"
            ))
        }
    };
    Ok(Join {
        name: r.group_name,
        rendezvous: Rendezvous {
            host: r.master_address,
            port: r.master_port,
            rank: r.rank_offset,
            world: r.world_size,
            store_is_external: false,
            timeout,
            backend,
        },
    })
}

fn update_request(r: UpdateRequest) -> Result<Incoming, String> {
    let n = r.names.len();
    if r.dtypes.len() != n || r.shapes.len() != n {
        return Err(format!(
            "names, dtypes and shapes must have one entry per tensor: {n} names, {} dtypes, {} shapes",
            r.dtypes.len(),
            r.shapes.len()
        ));
    }
    let mut tensors = Vec::with_capacity(n);
    for (i, ((name, dtype), shape)) in r.names.into_iter().zip(&r.dtypes).zip(r.shapes).enumerate()
    {
        let kind = temper_model::dtype::kind_from_torch_name(dtype).ok_or_else(|| {
            format!("dtypes[{i}]: {dtype:?} (expected float32, bfloat16, float16 or float64)")
        })?;
        if shape.iter().any(|&d| d < 0) {
            return Err(format!("shapes[{i}]: {shape:?} has a negative size"));
        }
        tensors.push((name, kind, shape));
    }
    Ok(Incoming {
        group: r.group_name,
        tensors,
    })
}

async fn init(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let state = &state;
    handle(state, &headers, &body, |r: InitRequest| async move {
        let join = join_request(r).map_err(bad)?;
        let groups = state.worker.weight_groups();
        tokio::task::spawn_blocking(move || groups.join(join))
            .await
            .map_err(|e| bad(format!("joining the group failed inside the server: {e}")))?
            .map_err(|e| bad(format!("{e:#}")))?;
        Ok(json!({"success": true, "message": "joined the weight update group"}))
    })
    .await
}

async fn update(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let state = &state;
    handle(state, &headers, &body, |r: UpdateRequest| async move {
        let version = r.weight_version.clone();
        let incoming = update_request(r).map_err(bad)?;
        let count = incoming.tensors.len();
        state.worker.receive_weights(incoming).await.map_err(bad)?;
        let mut reply = json!({"success": true, "message": format!("received {count} tensors")});
        if let Some(v) = version {
            reply["weight_version"] = Value::String(v);
        }
        Ok(reply)
    })
    .await
}

async fn destroy(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let state = &state;
    handle(state, &headers, &body, |r: DestroyRequest| async move {
        state
            .worker
            .weight_groups()
            .leave(&r.group_name)
            .map_err(|e| bad(format!("{e:#}")))?;
        Ok(json!({"success": true, "message": "left the weight update group"}))
    })
    .await
}

/// One group joined: its membership (used by one broadcast at a time) and whether it moves GPU
/// tensors (NCCL) or host ones (Gloo).
struct Group {
    comm: Mutex<Comm>,
    backend: Backend,
}

/// The groups the served model receives weights from, by name. Shared by the request handlers
/// (joining runs on a blocking thread of its own, so that a rendezvous that never completes
/// does not stop the serving) and the worker (receiving runs between its batches). The map is
/// locked only to find or change a group, never across a collective.
pub(crate) struct WeightGroups {
    /// The served model's device (NCCL groups move its memory).
    device: Device,
    groups: Mutex<HashMap<String, Arc<Group>>>,
}

impl WeightGroups {
    pub fn new(device: Device) -> Self {
        WeightGroups {
            device,
            groups: Mutex::new(HashMap::new()),
        }
    }

    fn groups(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Group>>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins `join`'s group as its rank (blocks until every rank has come, or the timeout). A
    /// group of the same name is left first: a trainer that comes back (a resumed run) forms it
    /// anew.
    pub fn join(&self, mut join: Join) -> Result<()> {
        if let Backend::Nccl { .. } = join.rendezvous.backend {
            match self.device {
                Device::Cuda(i) => join.rendezvous.backend = Backend::Nccl { device: i },
                other => bail!(
                    "backend: nccl needs the served model on a GPU (this server's is on {other:?}); use \"gloo\""
                ),
            }
        }
        self.groups().remove(&join.name);
        let comm = Comm::connect(&join.rendezvous)?;
        let group = Group {
            comm: Mutex::new(comm),
            backend: join.rendezvous.backend,
        };
        self.groups().insert(join.name, Arc::new(group));
        Ok(())
    }

    pub fn leave(&self, name: &str) -> Result<()> {
        match self.groups().remove(name) {
            Some(_) => Ok(()),
            None => bail!("group_name: no weight update group {name:?}"),
        }
    }

    /// Receives `incoming`'s tensors from rank 0 into `model`'s parameters of those names. Every
    /// name and shape is checked against the model before anything is received. The error says
    /// whether some weights had been replaced already ([`Received::Partly`]).
    pub fn receive(&self, incoming: Incoming, model: &CausalLm) -> Result<(), (Received, String)> {
        let refused = |e: String| (Received::Nothing, e);
        let group = self.groups().get(&incoming.group).cloned().ok_or_else(|| {
            refused(format!(
                "group_name: no weight update group {:?} (POST /init_weights_update_group first)",
                incoming.group
            ))
        })?;
        let params: HashMap<String, Tensor> = model.named_parameters().into_iter().collect();
        for (i, (name, _, shape)) in incoming.tensors.iter().enumerate() {
            let Some(p) = params.get(name) else {
                return Err(refused(format!(
                    "names[{i}]: {name:?} is not a parameter of the served model"
                )));
            };
            if p.size() != *shape {
                return Err(refused(format!(
                    "shapes[{i}]: {shape:?} for {name:?}, the served model's is {:?}",
                    p.size()
                )));
            }
        }
        // Gloo moves host tensors; NCCL the GPU's.
        let device = match group.backend {
            Backend::Nccl { device } => Device::Cuda(device),
            Backend::Gloo => Device::Cpu,
        };
        let comm = group.comm.lock().unwrap_or_else(|e| e.into_inner());
        tch::no_grad(|| {
            for (k, (name, kind, shape)) in incoming.tensors.iter().enumerate() {
                let buffer = Tensor::empty(shape.as_slice(), (*kind, device));
                if let Err(e) = comm.broadcast(&buffer, 0) {
                    let how = if k == 0 {
                        Received::Nothing
                    } else {
                        Received::Partly
                    };
                    return Err((how, format!("receiving {name}: {e:#}")));
                }
                params[name].shallow_clone().copy_(&buffer);
            }
            Ok(())
        })
    }
}

/// How far a failed update got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Received {
    /// Refused or failed before any weight changed: the old weights serve on.
    Nothing,
    /// Some weights are the new ones, others the old: the model serves nothing until weights
    /// arrive whole (a push or a reload).
    Partly,
}
