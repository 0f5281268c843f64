// torch.distributed's c10d from Rust: a TCPStore rendezvous and a Gloo process group (CPU), and the
// three collectives temper needs (all_reduce sum, broadcast, all_gather). Every function returns 0
// on success, or 1 with `*err` set to a malloc'ed message (freed by temper_kernels_free_error).
// Built only when the gloo headers are present (scripts/setup-env.sh installs Debian's
// libgloo-dev); the c10d code itself is libtorch_cpu's.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "guarded.h"

namespace {

using temper::guarded;

struct Comm {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::chrono::milliseconds timeout;
};

void wait(Comm* c, const c10::intrusive_ptr<c10d::Work>& work) { work->wait(c->timeout); }

}  // namespace

extern "C" {

int temper_comm_available() { return 1; }

// Rendezvous at host:port (rank 0 hosts the store unless `store_is_external`, as under torchrun's
// agent store) and join a Gloo group of `world` ranks. `timeout_ms` bounds the rendezvous and every
// collective.
int temper_comm_new(const char* host, int port, int rank, int world, int store_is_external,
                    long timeout_ms, void** out, char** err) {
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
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    if (std::string(host) != "127.0.0.1" && std::string(host) != "localhost") {
      options->devices.clear();
      options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
    *out = new Comm{store, pg, timeout};
  });
}

void temper_comm_free(void* comm) { delete static_cast<Comm*>(comm); }

// In place: t = sum over ranks of t.
int temper_comm_all_reduce(void* comm, void* tensor, char** err) {
  return guarded(err, [&] {
    auto* c = static_cast<Comm*>(comm);
    std::vector<at::Tensor> ts{*static_cast<at::Tensor*>(tensor)};
    wait(c, c->pg->allreduce(ts));
  });
}

// In place: t = rank root's t.
int temper_comm_broadcast(void* comm, void* tensor, int root, char** err) {
  return guarded(err, [&] {
    auto* c = static_cast<Comm*>(comm);
    std::vector<at::Tensor> ts{*static_cast<at::Tensor*>(tensor)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    wait(c, c->pg->broadcast(ts, o));
  });
}

// out = every rank's t stacked along a new first dim, in rank order (same shape on every rank).
int temper_comm_all_gather(void* comm, void* tensor, void** out, char** err) {
  return guarded(err, [&] {
    auto* c = static_cast<Comm*>(comm);
    auto t = static_cast<at::Tensor*>(tensor)->contiguous();
    std::vector<at::Tensor> parts;
    for (int i = 0; i < c->pg->getSize(); i++) parts.push_back(at::empty_like(t));
    std::vector<std::vector<at::Tensor>> outs{parts};
    std::vector<at::Tensor> in{t};
    wait(c, c->pg->allgather(outs, in));
    *out = new at::Tensor(at::stack(outs[0], 0));
  });
}

int temper_comm_barrier(void* comm, char** err) {
  return guarded(err, [&] {
    auto* c = static_cast<Comm*>(comm);
    wait(c, c->pg->barrier());
  });
}

}  // extern "C"
