// CUDA graphs for the sampling engine's decode step (temper-model's static decode): libtorch's
// `at::cuda::CUDAGraph`, driven from Rust. Between `temper_graph_begin` and `temper_graph_end`
// every op temper launches on this thread goes into the graph instead of running: the capture
// happens on a side stream (CUDA cannot capture the legacy default stream), which a stream guard
// makes current until the capture ends. The graphs of one decoder share one memory pool
// (`temper_graph_pool`): they are replayed one at a time, and each one's output is read before
// another replays. Compiled only into CUDA builds; graph_stub.cpp answers in CPU builds.
//
// Only libtorch's own functions are called (the device-generic guards, not CUDAGuard, whose inline
// implementation would call CUDA's runtime from here and need it linked).
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "guarded.h"

using temper::guarded;

namespace {
struct Graph {
  at::cuda::CUDAGraph graph;
  // The side stream the capture runs on, current from begin to end.
  std::optional<c10::StreamGuard> on_side_stream;
};
}  // namespace

extern "C" {

int temper_graphs_available() { return 1; }

// A new memory pool id for graphs that share memory.
int temper_graph_pool(uint64_t* first, uint64_t* second, char** err) {
  return guarded(err, [&] {
    auto id = at::cuda::graph_pool_handle();
    *first = id.first;
    *second = id.second;
  });
}

// Starts capturing on `device` into a new graph that allocates from pool (first, second).
int temper_graph_begin(int device, uint64_t first, uint64_t second, void** out, char** err) {
  return guarded(err, [&] {
    auto index = static_cast<c10::DeviceIndex>(device);
    c10::DeviceGuard on_device(c10::Device(c10::DeviceType::CUDA, index));
    // The capture must not race work queued before it (the cache writes of a prefill, say).
    c10::cuda::device_synchronize();
    auto g = std::make_unique<Graph>();
    g->on_side_stream.emplace(c10::cuda::getStreamFromPool(false, index).unwrap());
    // Thread-local: other threads' CUDA calls (a server's) neither break nor join the capture.
    g->graph.capture_begin({first, second}, cudaStreamCaptureModeThreadLocal);
    *out = g.release();
  });
}

// Ends the capture begun by temper_graph_begin. On failure (an op that cannot be captured ran in
// between) the graph is unusable: free it; the stream is back to normal either way.
int temper_graph_end(void* graph, char** err) {
  auto* g = static_cast<Graph*>(graph);
  int status = guarded(err, [&] { g->graph.capture_end(); });
  g->on_side_stream.reset();
  return status;
}

int temper_graph_replay(void* graph, char** err) {
  return guarded(err, [&] { static_cast<Graph*>(graph)->graph.replay(); });
}

void temper_graph_free(void* graph) { delete static_cast<Graph*>(graph); }

// From now on the calling thread's work on `device` goes to a stream of its own (a non-blocking
// stream): the in-process sampler thread's decode steps run beside the learner's work on the
// default stream instead of queued behind it. From libtorch's high-priority pool: the graph
// captures (temper_graph_begin) and NCCL take theirs from the low-priority one, so none of them
// lands on this thread's stream.
int temper_use_own_stream(int device, char** err) {
  return guarded(err, [&] {
    auto index = static_cast<c10::DeviceIndex>(device);
    c10::cuda::setCurrentCUDAStream(c10::cuda::getStreamFromPool(true, index));
  });
}

// Waits until the work queued on the calling thread's current stream on `device` is done (the
// generic c10::Stream call: no CUDA runtime called from here).
int temper_sync_current_stream(int device, char** err) {
  return guarded(err, [&] {
    c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).unwrap().synchronize();
  });
}

}  // extern "C"
