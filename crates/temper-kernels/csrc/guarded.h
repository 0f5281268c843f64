// The error convention of temper-kernels' C functions: 0 on success, or 1 with `*err` set to a
// malloc'ed message (freed by temper_kernels_free_error). Shared by kernels.cpp and comm.cpp.
#pragma once

#include <cstdlib>
#include <cstring>
#include <exception>

namespace temper {

inline char* copy_message(const char* msg) {
  size_t n = std::strlen(msg);
  char* out = static_cast<char*>(std::malloc(n + 1));
  if (out != nullptr) std::memcpy(out, msg, n + 1);
  return out;
}

// Runs `f`, turning any C++ exception into the error convention above.
template <typename F>
int guarded(char** err, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    *err = copy_message(e.what());
  } catch (...) {
    *err = copy_message("unknown C++ exception");
  }
  return 1;
}

}  // namespace temper
