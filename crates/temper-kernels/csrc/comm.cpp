// torch.distributed's c10d from Rust: a TCPStore rendezvous and a Gloo (CPU) or NCCL (CUDA)
// process group, and the collectives temper needs (all_reduce sum, broadcast, all_gather,
// all_gather into one tensor, reduce_scatter, barrier). Every function returns 0 on success, or 1 with `*err` set to a malloc'ed message
// (freed by temper_kernels_free_error). Built only when the gloo headers are present
// (scripts/setup-env.sh installs Debian's libgloo-dev); NCCL only when libtorch_cuda, nccl.h and
// CUDA's headers were found too (USE_C10D_NCCL, build.rs). The c10d code itself is libtorch's.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <stdexcept>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <cstring>
#include <string>
#include <vector>

#include "guarded.h"

namespace {

using temper::guarded;

struct Comm {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> pg;
  std::chrono::milliseconds timeout;
  // NCCL works on CUDA tensors of this rank's device; others are staged through it.
  bool nccl;
  int device;
};

void wait(Comm* c, const c10::intrusive_ptr<c10d::Work>& work) { work->wait(c->timeout); }

// `wait`, unless `*give_up` turns true first (read atomically; another thread sets it): then
// false, the work left pending. Completion is polled (short pauses, growing to 2 ms), since a
// blocking wait cannot be interrupted.
bool wait_unless(Comm* c, const c10::intrusive_ptr<c10d::Work>& work, const bool* give_up) {
  auto deadline = std::chrono::steady_clock::now() + c->timeout;
  auto pause = std::chrono::microseconds(10);
  while (!work->isCompleted()) {
    if (__atomic_load_n(give_up, __ATOMIC_ACQUIRE)) return false;
    if (std::chrono::steady_clock::now() > deadline) break;  // the wait below reports it
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
  wait(c, work);
  return true;
}

// The tensor a collective runs on: `t` itself, or (NCCL, `t` on the CPU) a copy on the rank's GPU.
at::Tensor staged(Comm* c, const at::Tensor& t) {
  if (!c->nccl || t.is_cuda()) return t;
  return t.to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(c->device)));
}

// Copies a staged result back into `t` when staging made a copy.
void unstage(const at::Tensor& staged_t, at::Tensor& t) {
  if (!staged_t.is_same(t)) t.copy_(staged_t);
}

// A contiguous tensor's flat view, on the rank's GPU for NCCL (a copy when it is elsewhere).
at::Tensor staged_flat(Comm* c, const at::Tensor& t) { return staged(c, t.view({-1})); }

// Copies a staged flat result back into `t` when staging copied it to another device (a view of
// `t` itself already holds it).
void unstage_flat(const at::Tensor& flat, at::Tensor& t) {
  if (flat.device() != t.device()) t.view({-1}).copy_(flat);
}

}  // namespace

extern "C" {

int temper_comm_available() { return 1; }

int temper_comm_nccl_available() {
#ifdef USE_C10D_NCCL
  return 1;
#else
  return 0;
#endif
}

// Rendezvous at host:port (rank 0 hosts the store unless `store_is_external`, as under torchrun's
// agent store) and join a group of `world` ranks: Gloo (`backend` 0) or NCCL (`backend` 1, on CUDA
// device `device`). `timeout_ms` bounds the rendezvous and every collective.
int temper_comm_new(const char* host, int port, int rank, int world, int store_is_external,
                    long timeout_ms, int backend, int device, void** out, char** err) {
  return guarded(err, [&] {
    auto timeout = std::chrono::milliseconds(timeout_ms);
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(port);
    opts.isServer = rank == 0 && !store_is_external;
    opts.numWorkers = world;
    opts.waitWorkers = true;
    opts.timeout = timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    auto store = c10::make_intrusive<c10d::PrefixStore>("temper", tcp);
    if (backend == 1) {
#ifdef USE_C10D_NCCL
      c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
      auto nopts = c10d::ProcessGroupNCCL::Options::create();
      nopts->timeout = timeout;
      auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, nopts);
      *out = new Comm{store, pg, timeout, true, device};
      return;
#else
      throw std::runtime_error(
          "this temper was built without NCCL (no libtorch_cuda, nccl.h or CUDA headers at build "
          "time; a CPU-only build uses gloo)");
#endif
    }
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    if (std::string(host) != "127.0.0.1" && std::string(host) != "localhost") {
      options->devices.clear();
      options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
    *out = new Comm{store, pg, timeout, false, -1};
  });
}

// NCCL wants its communicators shut down before the group goes (destroy_process_group's
// work; without it ProcessGroupNCCL warns of leaked resources at exit). Gloo's is a no-op.
void temper_comm_free(void* comm) {
  auto* c = static_cast<Comm*>(comm);
  try {
    c->pg->shutdown();
  } catch (...) {
    // Leaving anyway: a failed shutdown must not take the process down on its way out.
  }
  delete c;
}

// In place: t = sum over ranks of t.
int temper_comm_all_reduce(void* comm, void* tensor, char** err) {
  return guarded(err, [&] {
    auto* c = static_cast<Comm*>(comm);
    auto& t = *static_cast<at::Tensor*>(tensor);
    std::vector<at::Tensor> ts{staged(c, t)};
    wait(c, c->pg->allreduce(ts));
    unstage(ts[0], t);
  });
}

// In place: t = rank root's t.
int temper_comm_broadcast(void* comm, void* tensor, int root, char** err) {
  return guarded(err, [&] {
    auto* c = static_cast<Comm*>(comm);
    auto& t = *static_cast<at::Tensor*>(tensor);
    std::vector<at::Tensor> ts{staged(c, t)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    wait(c, c->pg->broadcast(ts, o));
    unstage(ts[0], t);
  });
}

// temper_comm_broadcast, unless `*give_up` turns true first (another thread learnt that a peer
// will not take part: a server refused the push): then 2, with `*err` unset. The broadcast is
// left pending, so the group can no longer be used, nor freed (freeing waits for it).
int temper_comm_broadcast_unless(void* comm, void* tensor, int root, const bool* give_up,
                                 char** err) {
  bool done = true;
  int status = guarded(err, [&] {
    auto* c = static_cast<Comm*>(comm);
    auto& t = *static_cast<at::Tensor*>(tensor);
    std::vector<at::Tensor> ts{staged(c, t)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    done = wait_unless(c, c->pg->broadcast(ts, o), give_up);
    if (done) unstage(ts[0], t);
  });
  return status == 0 && !done ? 2 : status;
}

// out = every rank's t stacked along a new first dim, in rank order (same shape on every rank).
int temper_comm_all_gather(void* comm, void* tensor, void** out, char** err) {
  return guarded(err, [&] {
    auto* c = static_cast<Comm*>(comm);
    auto original = static_cast<at::Tensor*>(tensor);
    auto t = staged(c, original->contiguous());
    std::vector<at::Tensor> parts;
    for (int i = 0; i < c->pg->getSize(); i++) parts.push_back(at::empty_like(t));
    std::vector<std::vector<at::Tensor>> outs{parts};
    std::vector<at::Tensor> in{t};
    wait(c, c->pg->allgather(outs, in));
    *out = new at::Tensor(at::stack(outs[0], 0).to(original->device()));
  });
}

// `out` (contiguous, world x numel(shard) elements of shard's dtype) = every rank's `shard`
// concatenated in rank order: torch.distributed.all_gather_into_tensor, what sharded training
// gathers a unit's weights with.
int temper_comm_all_gather_into(void* comm, void* shard, void* out, char** err) {
  return guarded(err, [&] {
    auto* c = static_cast<Comm*>(comm);
    auto& o = *static_cast<at::Tensor*>(out);
    auto s = staged_flat(c, static_cast<at::Tensor*>(shard)->contiguous());
    auto flat = staged_flat(c, o);
    wait(c, c->pg->_allgather_base(flat, s));
    unstage_flat(flat, o);
  });
}

// `out` (contiguous, numel(input) / world elements) = this rank's slice, in rank order, of the sum
// over ranks of `input`: torch.distributed.reduce_scatter_tensor with SUM, what sharded training
// reduces gradients into their shards with.
int temper_comm_reduce_scatter(void* comm, void* input, void* out, char** err) {
  return guarded(err, [&] {
    auto* c = static_cast<Comm*>(comm);
    auto& o = *static_cast<at::Tensor*>(out);
    auto in = staged_flat(c, static_cast<at::Tensor*>(input)->contiguous());
    auto flat = staged_flat(c, o);
    wait(c, c->pg->_reduce_scatter_base(flat, in));
    unstage_flat(flat, o);
  });
}

int temper_comm_barrier(void* comm, char** err) {
  return guarded(err, [&] {
    auto* c = static_cast<Comm*>(comm);
    wait(c, c->pg->barrier());
  });
}

}  // extern "C"
