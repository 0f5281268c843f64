// Ops that libtorch registers but tch does not bind, called through the dispatcher (boxed, so no
// C++ signature has to match the registration's). Every function returns 0 on success, or 1 with
// `*err` set to a malloc'ed message (freed by temper_kernels_free_error).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace {

char* copy_message(const char* msg) {
  size_t n = std::strlen(msg);
  char* out = static_cast<char*>(std::malloc(n + 1));
  if (out != nullptr) std::memcpy(out, msg, n + 1);
  return out;
}

std::optional<c10::OperatorHandle> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchema({name, ""});
}

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

}  // namespace

extern "C" {

void temper_kernels_free_error(char* err) { std::free(err); }

// 1 when oneDNN's linear ops are registered in this libtorch (CPU builds with mkldnn).
int temper_kernels_have_packed_linear() {
  return find_op("mkldnn::_reorder_linear_weight").has_value() &&
         find_op("mkldnn::_linear_pointwise").has_value();
}

// W (N, K) -> oneDNN's blocked layout for `temper_packed_linear` (an opaque tensor: only pass it
// back to temper_packed_linear).
int temper_pack_linear_weight(const at::Tensor* w, at::Tensor** out, char** err) {
  return guarded(err, [&] {
    static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(
        "mkldnn::_reorder_linear_weight", "");
    torch::jit::Stack stack;
    stack.emplace_back(*w);
    stack.emplace_back(c10::IValue());  // batch_size: None
    op.callBoxed(&stack);
    *out = new at::Tensor(stack.back().toTensor());
  });
}

// x (M, K) @ W^T (+ b), with W from temper_pack_linear_weight; same dtype as x.
int temper_packed_linear(const at::Tensor* x, const at::Tensor* w, const at::Tensor* bias,
                         at::Tensor** out, char** err) {
  return guarded(err, [&] {
    static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(
        "mkldnn::_linear_pointwise", "");
    torch::jit::Stack stack;
    stack.emplace_back(*x);
    stack.emplace_back(*w);
    if (bias != nullptr) {
      stack.emplace_back(*bias);
    } else {
      stack.emplace_back(c10::IValue());
    }
    stack.emplace_back(std::string("none"));
    stack.emplace_back(c10::List<std::optional<at::Scalar>>());
    stack.emplace_back(c10::IValue());  // algorithm: None
    op.callBoxed(&stack);
    *out = new at::Tensor(stack.back().toTensor());
  });
}

}  // extern "C"
