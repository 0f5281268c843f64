// libtorch's profiler (Kineto, what `torch.profiler.profile` runs), started and stopped around a
// stretch of work and saved as a Chrome trace (chrome://tracing, Perfetto). Error convention:
// guarded.h.
#include <torch/csrc/autograd/profiler_kineto.h>

#include <set>
#include <string>

#include "guarded.h"

namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

extern "C" {

// Starts collecting every op on this process's threads (and CUDA kernels when `cuda`), with
// input shapes, as `torch.profiler.profile(record_shapes=True)` does.
int temper_profiler_start(int cuda, char** err) {
  return temper::guarded(err, [&] {
    impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/true);
    std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
    if (cuda != 0) activities.insert(impl::ActivityType::CUDA);
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
  });
}

// Stops collecting and writes the trace as Chrome trace JSON to `path`.
int temper_profiler_stop(const char* path, char** err) {
  return temper::guarded(err, [&] {
    auto result = prof::disableProfiler();
    result->save(std::string(path));
  });
}

}  // extern "C"
