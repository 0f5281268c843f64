// Ops that libtorch registers but tch does not bind, called through the dispatcher (boxed, so no
// C++ signature has to match the registration's). Every function returns 0 on success, or 1 with
// `*err` set to a malloc'ed message (freed by temper_kernels_free_error).
#include <ATen/ATen.h>
#include <ATen/ops/fbgemm_linear_fp16_weight_fp32_activation.h>
#include <ATen/ops/fbgemm_pack_gemm_matrix_fp16.h>
#include <c10/util/Exception.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/Parallel.h>
#include <ATen/core/stack.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cmath>
#include <limits>
#include <vector>

#include <cstdlib>
#include <cstring>
#if defined(__GLIBC__)
#include <malloc.h>
#include <unistd.h>
#endif
#include <optional>
#include <string>

#include "guarded.h"

namespace {

using temper::guarded;

std::optional<c10::OperatorHandle> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchema({name, ""});
}

// 16 floats: one AVX-512 register, two AVX2 ones, four SSE ones (GCC vector extensions, so each
// `target_clones` version below gets its own instruction set from the same source).
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

inline v16f vload(const float* p) {
  v16f r;
  std::memcpy(&r, p, sizeof r);
  return r;
}

inline void vstore(float* p, v16f v) { std::memcpy(p, &v, sizeof v); }

typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef uint32_t v16u32 __attribute__((vector_size(64)));

// 16 bf16 values widened to f32: a bf16 number is the upper half of the f32 with the same value,
// so the conversion is exact (a bf16 KV cache read here gives the f32 kernel's result bit for bit).
inline v16f vload(const c10::BFloat16* p) {
  v16u16 h;
  std::memcpy(&h, p, sizeof h);
  const v16u32 w = __builtin_convertvector(h, v16u32) << 16;
  v16f r;
  std::memcpy(&r, &w, sizeof r);
  return r;
}

inline v16f vsplat(float x) { return v16f{} + x; }

typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

// Sum of the 16 lanes by halving (16 -> 8 -> 4 -> 1): two vector adds and three scalar ones, not
// a chain of 15 dependent scalar adds (the dot product of every key ends in one of these).
inline float hsum(v16f v) {
  v8f lo, hi;
  std::memcpy(&lo, &v, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
  const v8f s8 = lo + hi;
  v4f a, b;
  std::memcpy(&a, &s8, sizeof a);
  std::memcpy(&b, reinterpret_cast<const char*>(&s8) + sizeof a, sizeof b);
  const v4f s4 = a + b;
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// exp(x) for x <= 0, 16 at a time (std::exp is a scalar call, and attention takes one per key per
// query head): Cephes' expf, a degree-6 polynomial after range reduction, within 2 ulp of the exact
// value; exactly 0 below -87 (masked keys are -inf).
inline v16f exp_nonpositive(v16f x) {
  const v16f xc = x < -87.0f ? vsplat(-87.0f) : x;
  const v16f t = xc * 1.44269504088896341f + 0.5f;
  v16i n = __builtin_convertvector(t, v16i);  // truncates toward zero; t < 1 here
  v16f fx = __builtin_convertvector(n, v16f);
  const v16i below = fx > t;                  // floor for negative non-integers
  n = n + below;                              // `below` is -1 where true
  fx = __builtin_convertvector(n, v16f);
  v16f r = xc - fx * 0.693359375f;
  r = r - fx * -2.12194440e-4f;
  const v16f z = r * r;
  v16f y = vsplat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  const v16i bits = (n + 127) << 23;
  v16f scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < -87.0f ? v16f{} : y * scale;
}

// One (batch row, kv head) of decode attention: the `group` query heads that share this kv head,
// one query each. The first query head pulls this head's keys and values from memory (decode
// attention is bound by reading the cache); the others find them in L2. D, the head dim, is a
// compile-time constant so that a query row and an output row live in registers. `KV` is the
// cache's element type (float, or c10::BFloat16 widened exactly as it is read).
// `target_clones` builds AVX-512, AVX2 and baseline versions and picks one at load time.
// `scores` has room for `s_len` rounded up to a multiple of 16.
template <int D, typename KV>
__attribute__((target_clones("avx512f", "avx2", "default")))
void attend_one(const float* q, int64_t group, const KV* k, const KV* v, int64_t s_len,
                int64_t s_stride, const float* bias, float scale, float* scores, float* out) {
  constexpr int N = D / 16;
  static_assert(D % 16 == 0, "head dim must be a multiple of 16");
  const int64_t s_pad = (s_len + 15) / 16 * 16;
  for (int64_t j = 0; j < group; ++j) {
    v16f qv[N];
    for (int i = 0; i < N; ++i) qv[i] = vload(q + j * D + 16 * i);
    for (int64_t s = 0; s < s_len; ++s) {
      const KV* ks = k + s * s_stride;
      v16f acc = qv[0] * vload(ks);
      for (int i = 1; i < N; ++i) acc += qv[i] * vload(ks + 16 * i);
      scores[s] = hsum(acc) * scale + bias[s];
    }
    for (int64_t s = s_len; s < s_pad; ++s) scores[s] = -INFINITY;
    v16f m = vsplat(-INFINITY);
    for (int64_t s = 0; s < s_pad; s += 16) {
      const v16f x = vload(scores + s);
      m = x > m ? x : m;
    }
    float mx = m[0];
    for (int l = 1; l < 16; ++l) mx = std::max(mx, m[l]);
    v16f sum = {};
    for (int64_t s = 0; s < s_pad; s += 16) {
      const v16f e = exp_nonpositive(vload(scores + s) - mx);
      vstore(scores + s, e);
      sum += e;
    }
    const float inv = 1.f / hsum(sum);
    v16f o[N] = {};
    for (int64_t s = 0; s < s_len; ++s) {
      const KV* vs = v + s * s_stride;
      const v16f p = vsplat(scores[s]);
      for (int i = 0; i < N; ++i) o[i] += p * vload(vs + 16 * i);
    }
    for (int i = 0; i < N; ++i) vstore(out + j * D + 16 * i, o[i] * inv);
  }
}

template <typename KV>
using AttendFn = void (*)(const float*, int64_t, const KV*, const KV*, int64_t, int64_t,
                          const float*, float, float*, float*);

template <typename KV>
AttendFn<KV> attend_for(int64_t d) {
  switch (d) {
    case 16: return attend_one<16, KV>;
    case 32: return attend_one<32, KV>;
    case 64: return attend_one<64, KV>;
    case 80: return attend_one<80, KV>;
    case 96: return attend_one<96, KV>;
    case 128: return attend_one<128, KV>;
    case 256: return attend_one<256, KV>;
    default: return nullptr;
  }
}

// One decode attention call's shapes, pointers and strides, for either cache element type.
template <typename KV>
void attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& bias, double scale, at::Tensor& result) {
  const int64_t b = q.size(0), hq = q.size(1), d = q.size(2);
  const int64_t hkv = k.size(1), s_len = k.size(2);
  const int64_t group = hq / hkv;
  const AttendFn<KV> attend = attend_for<KV>(d);
  TORCH_CHECK(attend != nullptr, "decode attention: head dim ", d,
              " is not supported (16, 32, 64, 80, 96, 128, 256)");
  const float* qp = q.data_ptr<float>();
  const KV* kp = k.data_ptr<KV>();
  const KV* vp = v.data_ptr<KV>();
  const float* bp = bias.data_ptr<float>();
  float* op = result.data_ptr<float>();
  const int64_t kb = k.stride(0), kh = k.stride(1), ks = k.stride(2);
  at::parallel_for(0, b * hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores((s_len + 15) / 16 * 16);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t bi = i / hkv, h = i % hkv;
      attend(qp + (bi * hq + h * group) * d, group, kp + bi * kb + h * kh, vp + bi * kb + h * kh,
             s_len, ks, bp + bi * s_len, static_cast<float>(scale), scores.data(),
             op + (bi * hq + h * group) * d);
    }
  });
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

// Swallows libtorch warnings while alive: PyTorch marks FBGEMM's fp16 ops deprecated and warns on
// first use, which would land in every `temper sample` run. (If a release drops them, packing
// fails and temper falls back to plain matmuls.)
struct QuietWarnings : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

// W (N, K), f32 values that fp16 holds (the caller checks the range) -> FBGEMM's packed fp16 matrix
// for temper_fp16_linear (an opaque tensor).
int temper_pack_fp16_weight(const at::Tensor* w, at::Tensor** out, char** err) {
  return guarded(err, [&] {
    QuietWarnings quiet;
    c10::WarningUtils::WarningHandlerGuard guard(&quiet);
    *out = new at::Tensor(at::fbgemm_pack_gemm_matrix_fp16(w->to(at::kFloat).contiguous()));
  });
}

// x (M, K) f32 @ W^T (+ b, f32) with W from temper_pack_fp16_weight: fp16 weights, f32 activations
// and accumulation (FBGEMM's AVX2/AVX-512 kernels). Returns f32.
int temper_fp16_linear(const at::Tensor* x, const at::Tensor* w, const at::Tensor* bias,
                       at::Tensor** out, char** err) {
  return guarded(err, [&] {
    QuietWarnings quiet;
    c10::WarningUtils::WarningHandlerGuard guard(&quiet);
    std::optional<at::Tensor> b;
    if (bias != nullptr) b = *bias;
    *out = new at::Tensor(at::fbgemm_linear_fp16_weight_fp32_activation(*x, *w, b));
  });
}

// 1 when temper_decode_attention has a kernel for head dim `d`.
int temper_decode_attention_supports(int64_t d) { return attend_for<float>(d) != nullptr; }

// Attention of one new token per row over a cache on CPU, computed in f32:
//   q (B, Hq, d) f32 contiguous, k and v (B, Hkv, S, d) both f32 or both bf16, with unit stride
//   in d (views of a larger cache buffer are fine), bias (B, S) f32 contiguous additive mask
//   (0 or -inf);
//   out (B, Hq, d) = softmax(q k^T * scale + bias) v, query head h reading kv head h / (Hq / Hkv).
int temper_decode_attention(const at::Tensor* q, const at::Tensor* k, const at::Tensor* v,
                            const at::Tensor* bias, double scale, at::Tensor** out, char** err) {
  return guarded(err, [&] {
    TORCH_CHECK(q->dim() == 3 && k->dim() == 4 && v->dim() == 4 && bias->dim() == 2,
                "decode attention: q (B,Hq,d), k/v (B,Hkv,S,d), bias (B,S)");
    for (const at::Tensor* t : {q, k, v, bias}) {
      TORCH_CHECK(t->device().is_cpu(), "decode attention: CPU tensors only");
    }
    TORCH_CHECK(q->scalar_type() == at::kFloat && bias->scalar_type() == at::kFloat,
                "decode attention: q and bias f32");
    TORCH_CHECK(k->scalar_type() == v->scalar_type() &&
                    (k->scalar_type() == at::kFloat || k->scalar_type() == at::kBFloat16),
                "decode attention: k and v both f32 or both bf16");
    TORCH_CHECK(q->is_contiguous() && bias->is_contiguous(), "decode attention: q, bias contiguous");
    TORCH_CHECK(k->sizes() == v->sizes() && k->strides() == v->strides(),
                "decode attention: k and v differ in shape or strides");
    const int64_t b = q->size(0), hq = q->size(1), d = q->size(2);
    const int64_t hkv = k->size(1), s_len = k->size(2);
    TORCH_CHECK(k->size(0) == b && k->size(3) == d && hkv > 0 && hq % hkv == 0,
                "decode attention: shapes do not line up");
    TORCH_CHECK(k->stride(3) == 1, "decode attention: k/v need unit stride in the head dim");
    TORCH_CHECK(bias->size(0) == b && bias->size(1) == s_len, "decode attention: bias is (B, S)");
    at::Tensor result = at::empty({b, hq, d}, q->options());
    if (k->scalar_type() == at::kFloat) {
      attend_rows<float>(*q, *k, *v, *bias, scale, result);
    } else {
      attend_rows<c10::BFloat16>(*q, *k, *v, *bias, scale, result);
    }
    *out = new at::Tensor(result);
  });
}

// The CUDA caching allocator's peak of allocated bytes on `device` since the last reset (what
// torch.cuda.max_memory_allocated reports); with `reset`, the peak restarts from the current use.
// Fails (does not crash) where no CUDA allocator is registered: a CPU-only libtorch.
int temper_cuda_peak_allocated(int device, int reset, int64_t* peak, char** err) {
  return guarded(err, [&] {
    auto* allocator = c10::getDeviceAllocator(c10::DeviceType::CUDA);
    auto index = static_cast<c10::DeviceIndex>(device);
    auto stats = allocator->getDeviceStats(index);
    *peak = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
    if (reset) allocator->resetPeakStats(index);
  });
}

// The free and total memory of CUDA device `device` in bytes (torch.cuda.mem_get_info), through
// the registered CUDA allocator. Fails (does not crash) where none is registered.
int temper_cuda_memory_info(int device, int64_t* free_bytes, int64_t* total_bytes, char** err) {
  return guarded(err, [&] {
    auto* allocator = c10::getDeviceAllocator(c10::DeviceType::CUDA);
    auto info = allocator->getMemoryInfo(static_cast<c10::DeviceIndex>(device));
    *free_bytes = static_cast<int64_t>(info.first);
    *total_bytes = static_cast<int64_t>(info.second);
  });
}

// Drops the gradient of `t` (PyTorch's `p.grad = None`, what `optimizer.zero_grad()` does by
// default since 2.0): its memory is freed at once, and the next backward writes a fresh one.
int temper_clear_grad(at::Tensor* t, char** err) {
  return guarded(err, [&] { t->mutable_grad().reset(); });
}


// Gives `t` a zero gradient of its own shape and dtype if it has none (what the first backward
// would have written, had every element's gradient been zero).
int temper_zero_grad_if_missing(at::Tensor* t, char** err) {
  return guarded(err, [&] {
    if (!t->grad().defined()) t->mutable_grad() = at::zeros_like(*t);
  });
}
}  // extern "C"

namespace {
#if defined(__GLIBC__)
// A `VmXXX:` line of /proc/self/status, in bytes (0 when missing).
int64_t status_bytes(const std::string& status, const char* key) {
  auto at = status.find(key);
  if (at == std::string::npos) return 0;
  return std::atoll(status.c_str() + at + std::strlen(key)) * 1024;
}

struct Resident {
  int64_t now;   // VmRSS
  int64_t peak;  // VmHWM: the most the process has been resident
  // What is resident beyond malloc's live bytes: code, stacks, and free heap pages kept resident.
  int64_t slack;
};

Resident resident() {
  std::string status;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) status.append(buf, n);
    std::fclose(f);
  }
  int64_t now = status_bytes(status, "VmRSS:");
  auto info = mallinfo2();
  return {now, std::max(now, status_bytes(status, "VmHWM:")),
          now - int64_t(info.uordblks + info.hblkhd)};
}
#endif
}  // namespace

extern "C" {

// Hands malloc's free heap pages back to the kernel (glibc's malloc_trim) when that can lower the
// process's peak: the resident memory beyond malloc's live bytes has grown by 256 MiB since the
// last trim (or since the least it was seen), and the process is within 256 MiB of its peak. A
// backward frees one layer's saved activations while it allocates that layer's gradients, which
// often do not fit the holes the activations leave, so the heap grows around free memory that
// stays resident (Qwen2.5-0.5B's GRPO step: 1.5 GiB). Trimming costs page faults when the holes
// are used again (10% of SmolLM2's update when done regardless of the peak), hence the two
// conditions.
int temper_trim_heap_if_grown(char** err) {
  return guarded(err, [] {
#if defined(__GLIBC__)
    constexpr int64_t kStep = int64_t(256) << 20;
    static std::atomic<int64_t> least{INT64_MAX};
    auto r = resident();
    if (r.slack < least.load()) least.store(r.slack);
    if (r.slack >= least.load() + kStep && r.now + kStep >= r.peak) {
      malloc_trim(0);
      least.store(resident().slack);
    }
#endif
  });
}

// temper_trim_heap_if_grown each time a backward computes the gradient of `t` (the gradient passes
// unchanged): on a decoder layer's output, as the backward leaves each layer.
int temper_trim_heap_on_grad(at::Tensor* t, char** err) {
  return guarded(err, [&] {
    t->register_hook([](const at::Tensor&) {
      char* ignored = nullptr;
      if (temper_trim_heap_if_grown(&ignored) != 0) std::free(ignored);
    });
  });
}

}  // extern "C"
