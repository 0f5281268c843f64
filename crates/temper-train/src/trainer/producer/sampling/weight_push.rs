//! `rollout.weight_sync = "distributed"`: the weights reach the rollout servers over a c10d
//! group instead of a folder, in SGLang's protocol (`temper serve` and SGLang servers; vLLM keeps
//! the disk path). Rank 0 of the trainer is rank 0 of the group and hosts its store; each live
//! server joins when asked (`/init_weights_update_group`) as the next ranks (one per tensor-parallel
//! rank of an SGLang server, as its `/get_server_info` says). After an optimizer step every weight
//! is broadcast from rank 0 in order while the servers receive them
//! (`/update_weights_from_distributed` names, dtypes and shapes). A server left out since (it
//! stopped answering) is not waited for: the group is formed anew with the servers still in use.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;
use tch::{Device, Tensor};
use temper_kernels::{Backend, Comm, Rendezvous};
use temper_model::CausalLm;
use temper_rollout::remote::RemoteSampler;

use crate::config::WeightGroupBackend;

/// The group's name on the servers (SGLang's default).
const GROUP: &str = "weight_update_group";

/// Rank 0's membership in the weight update group, and how to form it again.
pub(crate) struct WeightGroup {
    comm: Comm,
    backend: Backend,
    /// The address the servers reach this process at.
    address: String,
    /// The servers in the group (their URLs), in rank order.
    members: Vec<String>,
}

impl WeightGroup {
    /// A new group of this process (rank 0, at `address`, which the servers must reach) and every
    /// live server of `sampler`: NCCL from a GPU trainer unless `backend` says Gloo, else Gloo.
    pub fn create(
        sampler: &RemoteSampler,
        address: &str,
        weights_on: Device,
        backend: WeightGroupBackend,
    ) -> Result<Self> {
        let port =
            temper_base::net::free_port_on(address).context("rollout.weight_group_address")?;
        let (backend, name) = match (weights_on, backend) {
            (Device::Cuda(device), WeightGroupBackend::Auto | WeightGroupBackend::Nccl) => {
                (Backend::Nccl { device }, "nccl")
            }
            (_, WeightGroupBackend::Nccl) => bail!(
                "rollout.weight_group_backend = \"nccl\" needs the trainer on a GPU (trainer.device)"
            ),
            _ => (Backend::Gloo, "gloo"),
        };
        // Each server's ranks: its tensor-parallel size (SGLang), else one.
        let members = sampler.live_urls();
        let mut ranks = vec![];
        for (url, info) in members.iter().zip(sampler.get_each("/get_server_info")) {
            let size = |key: &str| info.as_ref().and_then(|v| v[key].as_u64()).unwrap_or(1);
            if size("dp_size") > 1 {
                bail!(
                    "rollout.weight_sync = \"distributed\": {url} runs data-parallel replicas (dp_size {}); \
                     give each replica's URL in rollout.base_urls, or use weight_sync = \"disk\"",
                    size("dp_size")
                );
            }
            ranks.push(size("tp_size").max(1) as usize);
        }
        let world = 1 + ranks.iter().sum::<usize>();
        let offsets: Vec<usize> = ranks
            .iter()
            .scan(1, |next, &r| {
                let at = *next;
                *next += r;
                Some(at)
            })
            .collect();
        let rendezvous = Rendezvous {
            host: address.to_string(),
            port,
            rank: 0,
            world,
            store_is_external: false,
            timeout: temper_kernels::collective_timeout_from_env()?,
            backend,
        };
        let comm = sampler
            .post_each_during(
                "/init_weights_update_group",
                |k| {
                    json!({
                        "master_address": address, "master_port": port, "rank_offset": offsets[k],
                        "world_size": world, "group_name": GROUP, "backend": name,
                    })
                },
                |refused| Comm::connect_unless(&rendezvous, refused),
            )
            .context("rollout.weight_sync = \"distributed\": forming the weight update group")?;
        Ok(WeightGroup {
            comm,
            backend,
            address: address.to_string(),
            members,
        })
    }

    /// Broadcasts `weights` (Hugging Face names, as a saved folder would hold them) to the
    /// servers, which load them once the requests they hold are done; returns the seconds it
    /// took. `version` is the trainer's policy version (SGLang's `weight_version`). When a server
    /// was left out since the group formed, the group is formed anew first.
    pub fn push(
        &mut self,
        sampler: &RemoteSampler,
        weights: &[(String, Tensor)],
        version: u64,
    ) -> Result<f64> {
        let started = Instant::now();
        self.ready(sampler)?;
        self.send(sampler, weights, version)?;
        Ok(started.elapsed().as_secs_f64())
    }

    /// [`WeightGroup::push`] of `model` a part at a time ([`CausalLm::for_each_part`]: what lies
    /// outside the decoder layers, then each layer, each in a call of its own, as SGLang's
    /// protocol allows): with a sharded run's layers, one layer is whole at a time while the
    /// other ranks gather it too ([`CausalLm::sweep_layers`]). The servers' batches are drained
    /// before, so no request sees a half-pushed model.
    pub fn push_by_part(
        &mut self,
        sampler: &RemoteSampler,
        model: &CausalLm,
        version: u64,
    ) -> Result<f64> {
        let started = Instant::now();
        if let Err(e) = self.ready(sampler) {
            // The other ranks gather every layer with this one all the same.
            model.sweep_layers();
            return Err(e);
        }
        model.for_each_part(&mut |params| self.send(sampler, &params, version))?;
        Ok(started.elapsed().as_secs_f64())
    }

    /// Ready to push: the group formed anew when a server was left out since it formed.
    fn ready(&mut self, sampler: &RemoteSampler) -> Result<()> {
        sampler.check_alive();
        if sampler.live_urls().is_empty() {
            bail!("rollout.weight_sync = \"distributed\": no rollout server answers any more");
        }
        if sampler.live_urls() != self.members {
            let (device, backend) = match self.backend {
                Backend::Nccl { device } => (Device::Cuda(device), WeightGroupBackend::Nccl),
                Backend::Gloo => (Device::Cpu, WeightGroupBackend::Gloo),
            };
            eprintln!(
                "temper: rollout servers changed ({} in use): forming the weight update group anew",
                sampler.live_urls().len()
            );
            *self = WeightGroup::create(sampler, &self.address.clone(), device, backend)?;
        }
        Ok(())
    }

    /// One call of the protocol: `weights` broadcast in order while every server receives them.
    fn send(
        &self,
        sampler: &RemoteSampler,
        weights: &[(String, Tensor)],
        version: u64,
    ) -> Result<()> {
        let mut dtypes = Vec::with_capacity(weights.len());
        for (name, t) in weights {
            dtypes.push(
                temper_model::dtype::torch_dtype_name(t.kind()).with_context(|| {
                    format!("{name}: a weight of kind {:?} cannot be pushed", t.kind())
                })?,
            );
        }
        let names: Vec<&str> = weights.iter().map(|(n, _)| n.as_str()).collect();
        let shapes: Vec<Vec<i64>> = weights.iter().map(|(_, t)| t.size()).collect();
        let body = json!({
            "names": names, "dtypes": dtypes, "shapes": shapes, "group_name": GROUP,
            "weight_version": version.to_string(), "flush_cache": true,
        });
        let on = match self.backend {
            // Gloo sends host memory, NCCL the GPU's.
            Backend::Gloo => Device::Cpu,
            Backend::Nccl { device } => Device::Cuda(device),
        };
        sampler
            .post_each_during(
                "/update_weights_from_distributed",
                |_| body.clone(),
                |refused| {
                    tch::no_grad(|| -> Result<()> {
                        for (name, t) in weights {
                            let t = t.detach().to(on).contiguous();
                            // A server that refused the push (or stopped answering) is not
                            // waited for until the collective's timeout: its error is the
                            // push's.
                            let sent = self
                                .comm
                                .broadcast_unless(&t, 0, refused)
                                .with_context(|| format!("sending {name}"))?;
                            if !sent {
                                bail!("sending {name}: a server did not take the weights");
                            }
                        }
                        Ok(())
                    })
                },
            )
            .context("rollout.weight_sync = \"distributed\"")
    }
}
