//! `rollout.weight_sync = "distributed"`: the weights reach the rollout servers over a c10d
//! group instead of a folder, in SGLang's protocol (`temper serve` and SGLang servers; vLLM keeps
//! the disk path). Rank 0 of the trainer is rank 0 of the group and hosts its store; server k
//! (of the live ones) joins as rank k + 1 when asked (`/init_weights_update_group`). After an
//! optimizer step every weight is broadcast from rank 0 in order while the servers receive them
//! (`/update_weights_from_distributed` names, dtypes and shapes), Gloo from a CPU trainer and
//! NCCL from a GPU one.

use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::json;
use tch::{Device, Tensor};
use temper_kernels::{Backend, Comm, Rendezvous};
use temper_rollout::remote::RemoteSampler;

/// The group's name on the servers (SGLang's default).
const GROUP: &str = "weight_update_group";

/// Rank 0's membership in the weight update group.
pub(crate) struct WeightGroup {
    comm: Comm,
    backend: Backend,
}

impl WeightGroup {
    /// A new group of this process (rank 0, at `address`, which the servers must reach) and every
    /// live server of `sampler`. NCCL when the trainer's weights are on a GPU, else Gloo.
    pub fn create(sampler: &RemoteSampler, address: &str, weights_on: Device) -> Result<Self> {
        let port = std::net::TcpListener::bind((address, 0))
            .and_then(|l| l.local_addr())
            .with_context(|| format!("rollout.weight_group_address = {address:?}: no free port"))?
            .port();
        let world = sampler.live_count() + 1;
        let (backend, name) = match weights_on {
            Device::Cuda(device) => (Backend::Nccl { device }, "nccl"),
            _ => (Backend::Gloo, "gloo"),
        };
        let rendezvous = Rendezvous {
            host: address.to_string(),
            port,
            rank: 0,
            world,
            store_is_external: false,
            timeout: crate::dist::collective_timeout(),
            backend,
        };
        let comm = sampler
            .post_each_during(
                "/init_weights_update_group",
                |k| {
                    json!({
                        "master_address": address, "master_port": port, "rank_offset": k + 1,
                        "world_size": world, "group_name": GROUP, "backend": name,
                    })
                },
                || Comm::connect(&rendezvous),
            )
            .context("rollout.weight_sync = \"distributed\": forming the weight update group")?;
        Ok(WeightGroup { comm, backend })
    }

    /// Broadcasts `weights` (Hugging Face names, as a saved folder would hold them) to the
    /// servers, which load them once the requests they hold are done; returns the seconds it
    /// took. `version` is the trainer's policy version (SGLang's `weight_version`).
    pub fn push(
        &self,
        sampler: &RemoteSampler,
        weights: &[(String, Tensor)],
        version: u64,
    ) -> Result<f64> {
        let started = Instant::now();
        let names: Vec<&str> = weights.iter().map(|(n, _)| n.as_str()).collect();
        let dtypes: Vec<&str> = weights.iter().map(|(_, t)| dtype_name(t)).collect();
        let shapes: Vec<Vec<i64>> = weights.iter().map(|(_, t)| t.size()).collect();
        let body = json!({
            "names": names, "dtypes": dtypes, "shapes": shapes, "group_name": GROUP,
            "weight_version": version.to_string(), "flush_cache": true,
        });
        sampler
            .post_each_during(
                "/update_weights_from_distributed",
                |_| body.clone(),
                || {
                    tch::no_grad(|| -> Result<()> {
                        for (name, t) in weights {
                            // Gloo sends host memory, NCCL the GPU's.
                            let t = match self.backend {
                                Backend::Gloo => t.detach().to(Device::Cpu).contiguous(),
                                Backend::Nccl { device } => {
                                    t.detach().to(Device::Cuda(device)).contiguous()
                                }
                            };
                            self.comm
                                .broadcast(&t, 0)
                                .with_context(|| format!("sending {name}"))?;
                        }
                        Ok(())
                    })
                },
            )
            .context("rollout.weight_sync = \"distributed\"")?;
        Ok(started.elapsed().as_secs_f64())
    }
}

/// A tensor's dtype as SGLang's servers read it (`getattr(torch, name)`).
fn dtype_name(t: &Tensor) -> &'static str {
    match t.kind() {
        tch::Kind::BFloat16 => "bfloat16",
        tch::Kind::Half => "float16",
        tch::Kind::Double => "float64",
        _ => "float32",
    }
}
