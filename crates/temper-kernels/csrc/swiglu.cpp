// The decoder MLP's output projection of a SwiGLU product, as one autograd node that saves only
// the gate and up projections: `down(silu(gate) * up)`, where down(p) = p W^T (+ b)
// (+ scale * (p A^T) B^T, a LoRA adapter). Autograd over the separate ops saves four tensors of
// the intermediate size per token (silu's input, its output, `up`, and the product the output
// projection keeps for its weight gradient); this node saves two and recomputes the other two
// (elementwise, cheap) in the backward. For Qwen2.5-0.5B that is a third of a layer's saved
// activations. The ops are the ones autograd would run, in the same order, so outputs and
// gradients are bit for bit the unfused graph's (tests/swiglu.rs, f32 and bf16).
#include <torch/csrc/autograd/custom_function.h>
#include <ATen/ATen.h>

#include "guarded.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// `x.linear(w, b)` as autograd's linear computes it for x of any rank: x flattened to 2-D.
at::Tensor down_of(const at::Tensor& p, const at::Tensor& w, const at::Tensor& bias,
                   const at::Tensor& lora_a, const at::Tensor& lora_b, double scale) {
  auto y = at::linear(p, w, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
  if (lora_a.defined()) {
    y = y + at::linear(at::linear(p, lora_a), lora_b) * scale;
  }
  return y;
}

struct SwigluDown : public torch::autograd::Function<SwigluDown> {
  // The optional tensors are `std::optional` because autograd's custom functions take an
  // undefined `at::Tensor` for an input and fail on it; an absent optional is no input at all.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& w, const std::optional<at::Tensor>& bias,
                            const std::optional<at::Tensor>& lora_a,
                            const std::optional<at::Tensor>& lora_b, double scale) {
    auto a = lora_a.value_or(at::Tensor());
    auto b = lora_b.value_or(at::Tensor());
    ctx->save_for_backward({gate, up, w, a, b});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["has_bias"] = bias.has_value();
    return down_of(at::silu(gate) * up, w, bias.value_or(at::Tensor()), a, b, scale);
  }

  // The backward autograd would run over `silu`, `*`, the linear (and the adapter's two linears
  // and scaling), each weight gradient as mm's backward forms it for a linear's transposed
  // weight: grad^T input (checked bit for bit against autograd, tests/swiglu.rs).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& gate = saved[0];
    const auto& up = saved[1];
    const auto& w = saved[2];
    const auto& lora_a = saved[3];
    const auto& lora_b = saved[4];
    double scale = ctx->saved_data["scale"].toDouble();
    bool has_bias = ctx->saved_data["has_bias"].toBool();
    // needs_input_grad counts tensor inputs only: an absent bias shifts the adapter's.
    size_t edge_a = has_bias ? 4 : 3;

    auto s = at::silu(gate);
    auto p = s * up;
    auto p2 = p.reshape({-1, p.size(-1)});
    auto gy2 = grads[0].reshape({-1, grads[0].size(-1)});

    at::Tensor g_w, g_bias, g_a, g_b;
    if (ctx->needs_input_grad(2)) g_w = gy2.t().mm(p2);
    if (has_bias && ctx->needs_input_grad(3)) g_bias = gy2.sum(0);
    auto gp2 = gy2.mm(w);
    if (lora_a.defined()) {
      auto gv = gy2 * scale;
      auto g_u = gv.mm(lora_b);
      if (ctx->needs_input_grad(edge_a + 1)) g_b = gv.t().mm(p2.mm(lora_a.t()));
      if (ctx->needs_input_grad(edge_a)) g_a = g_u.t().mm(p2);
      gp2 = gp2 + g_u.mm(lora_a);
    }
    auto gp = gp2.view(p.sizes());
    at::Tensor g_gate, g_up;
    if (ctx->needs_input_grad(1)) g_up = gp * s;
    if (ctx->needs_input_grad(0)) g_gate = at::silu_backward(gp * up, gate);
    return {g_gate, g_up, g_w, g_bias, g_a, g_b, at::Tensor()};
  }
};

}  // namespace

extern "C" {

// `down(silu(gate) * up)` as above. bias, lora_a and lora_b may be null (none); all tensors in
// one dtype and on one device.
int temper_swiglu_down(const at::Tensor* gate, const at::Tensor* up, const at::Tensor* w,
                       const at::Tensor* bias, const at::Tensor* lora_a, const at::Tensor* lora_b,
                       double scale, at::Tensor** out, char** err) {
  return temper::guarded(err, [&] {
    auto opt = [](const at::Tensor* t) {
      return t != nullptr ? std::optional<at::Tensor>(*t) : std::nullopt;
    };
    TORCH_CHECK(gate->sizes() == up->sizes(), "swiglu_down: gate ", gate->sizes(), " and up ",
                up->sizes(), " differ");
    TORCH_CHECK(w->dim() == 2 && w->size(1) == gate->size(-1), "swiglu_down: weight ",
                w->sizes(), " does not take ", gate->size(-1), " inputs");
    TORCH_CHECK((lora_a == nullptr) == (lora_b == nullptr),
                "swiglu_down: a LoRA adapter needs both A and B");
    *out = new at::Tensor(
        SwigluDown::apply(*gate, *up, *w, opt(bias), opt(lora_a), opt(lora_b), scale));
  });
}

}  // extern "C"
