// The optimizer's multi-tensor ops that libtorch has and tch does not bind: PyTorch's fused
// AdamW (`torch._fused_adamw_`, what `torch.optim.AdamW(fused=True)` calls) and the foreach
// gradient-norm clip of `torch.nn.utils.clip_grad_norm_`. Each call covers every parameter, so a
// step is one kernel launch per op instead of several per parameter. Error convention:
// guarded.h.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstdint>
#include <vector>

#include "guarded.h"

namespace {

std::vector<at::Tensor> list_of(at::Tensor** ts, int64_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) out.push_back(*ts[i]);
  return out;
}

}  // namespace

extern "C" {

// `torch.optim.AdamW(fused=True).step()` on one device-and-dtype group (amsgrad and maximize
// off): the step counts are incremented first, as `_fused_adam` does, then one fused kernel
// updates params, exp_avgs and exp_avg_sqs in place.
int temper_fused_adamw(at::Tensor** params, at::Tensor** grads, at::Tensor** exp_avgs,
                       at::Tensor** exp_avg_sqs, at::Tensor** steps, int64_t n, double lr,
                       double beta1, double beta2, double weight_decay, double eps, char** err) {
  return temper::guarded(err, [&] {
    auto p = list_of(params, n);
    auto g = list_of(grads, n);
    auto m = list_of(exp_avgs, n);
    auto v = list_of(exp_avg_sqs, n);
    auto s = list_of(steps, n);
    c10::NoGradGuard no_grad;
    at::_foreach_add_(s, 1);
    at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, s, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false);
  });
}

// `torch.nn.utils.clip_grad_norm_(params, max_norm)` on gradients of one device, foreach path
// (PyTorch's default wherever foreach is supported, the CPU included): the per-tensor norms in
// one call, their norm, and every gradient scaled by `clamp(max_norm / (total + 1e-6), max=1)`
// when `max_norm > 0`. `*total` gets the pre-clip norm as a new 0-dim tensor (no host read).
int temper_clip_grad_norm(at::Tensor** grads, int64_t n, double max_norm, at::Tensor** total,
                          char** err) {
  return temper::guarded(err, [&] {
    auto g = list_of(grads, n);
    c10::NoGradGuard no_grad;
    auto norms = at::_foreach_norm(g, 2);
    auto t = at::linalg_vector_norm(at::stack(norms), 2);
    if (max_norm > 0) {
      // Python's `max_norm / tensor` is `tensor.reciprocal() * max_norm` (Tensor.__rtruediv__).
      auto coef = at::clamp_max(at::reciprocal(t + 1e-6) * max_norm, 1.0);
      at::_foreach_mul_(g, coef);
    }
    *total = new at::Tensor(std::move(t));
  });
}

}  // extern "C"
