#include "fsdp/models/attention.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>

#include "fsdp/common/compat.h"
#include "fsdp/common/error.h"
#include "fsdp/nn/dropout.h"
#include "kernels/kernels.h"

namespace fsdp::models {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool dropout_active(torch::nn::Dropout* dropout) {
  return dropout != nullptr && (*dropout)->is_training() && (*dropout)->options.p() > 0;
}

bool fused(const Tensor& t, torch::nn::Dropout* dropout) {
  return !dropout_active(dropout) && t.device().is_cpu() &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
}

// LibTorch's ops, for other devices and dtypes and for attention dropout.
Tensor composite_attention(const Tensor& q, const Tensor& k, const Tensor& v, torch::nn::Dropout* dropout) {
  const int64_t B = q.size(0), T = q.size(1), nh = q.size(2), hs = q.size(3);
  auto qh = q.transpose(1, 2), kh = k.transpose(1, 2), vh = v.transpose(1, 2);  // (B, heads, T, hs)
  const int64_t rep = nh / k.size(2);
  if (rep > 1) {
    kh = kh.repeat_interleave(rep, 1);
    vh = vh.repeat_interleave(rep, 1);
  }
  auto scores = qh.matmul(kh.transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(hs)));
  auto future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  auto weights = scores.masked_fill_(future, -std::numeric_limits<float>::infinity()).softmax(-1);
  auto y = (dropout != nullptr ? nn::dropout(*dropout, weights) : weights).matmul(vh);  // itself when off
  return y.transpose(1, 2).reshape({B, T, nh * hs});
}

// One head's (T, hs) matrix of a (B, T, heads, hs) tensor: a strided view
// whose rows are `stride(1)` apart, which BLAS and oneDNN take as is.
Tensor head(const Tensor& t, int64_t b, int64_t h) { return t.select(0, b).select(1, h); }

uint16_t* bf16_bits(const Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

// Causal attention skips the future by blocks of query rows: rows [r0, r1)
// see keys [0, r1) only, so the square's products above the diagonal
// blocks are never computed (at T = 256 in blocks of 64, 10 of 16 remain).
// Smaller blocks skip more but make smaller products, which bf16 runs far
// less efficiently: per step of gpt2-d6 (T = 256, 4 x 6 heads of 64),
// attention took 48 ms in fp32 with blocks of 64 or 128 against 55 without
// skipping; in bf16 62 ms with 64, 46 with 128 and 42 without
// (bench/profile_summary.py).
int64_t query_block(const Tensor& t) { return t.scalar_type() == at::kBFloat16 ? 256 : 64; }

// Rows [r0, r1) of the (T, T) scores, written up to column r1: row i holds
// i + 1 scores and zeros up to r1; nothing past r1 is read or written.
void softmax_rows(const Tensor& scores, int64_t r0, int64_t r1, float scale, std::vector<float>& scratch) {
  const int64_t T = scores.size(0);
  for (int64_t i = r0; i < r1; ++i) {
    if (scores.scalar_type() == at::kBFloat16) {
      kernels::causal_softmax_row_bf16(bf16_bits(scores) + i * T, scratch.data(), i + 1, r1, scale);
    } else {
      kernels::causal_softmax_row(scores.data_ptr<float>() + i * T, i + 1, r1, scale);
    }
  }
}

void softmax_backward_rows(const Tensor& probs, const Tensor& grad, int64_t r0, int64_t r1, float scale,
                           std::vector<float>& scratch) {
  const int64_t T = probs.size(0);
  for (int64_t i = r0; i < r1; ++i) {
    if (probs.scalar_type() == at::kBFloat16) {
      kernels::causal_softmax_backward_row_bf16(bf16_bits(probs) + i * T, bf16_bits(grad) + i * T, scratch.data(),
                                                i + 1, r1, scale);
    } else {
      kernels::causal_softmax_backward_row(probs.data_ptr<float>() + i * T, grad.data_ptr<float>() + i * T, i + 1,
                                           r1, scale);
    }
  }
}

float softmax_scale(const Tensor& q) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(q.size(3)))); }

// Rows [begin, begin + count) of a (T, hs) head or (T, T) matrix.
Tensor rows(const Tensor& t, int64_t begin, int64_t count) { return t.narrow(0, begin, count); }

// The state a task thread needs to run ATen ops on saved inputs: autograd
// off (worker threads start with it on, and the inputs require grad), and
// no profiler events, so the enclosing range's time is the whole work on
// every thread rather than the calling thread's share of it.
struct TaskThreadState {
  at::NoGradGuard no_grad;
  at::RecordFunctionGuard no_events{false};
};

// probs (B, nh, T, T) and y (B, T, nh, hs) from q, k, v (B, T, heads, hs).
// Each (batch, query head) pair is one task, its matmuls single-threaded
// inside the parallel region: many small products side by side keep the
// cores busier than one multi-threaded product after another. Only the
// lower block triangle of probs is written.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs, const Tensor& y) {
  RECORD_USER_SCOPE("fsdp::causal_attention");
  const int64_t B = q.size(0), T = q.size(1), nh = q.size(2), rep = nh / k.size(2);
  const float scale = softmax_scale(q);
  const int64_t block = query_block(q);
  at::parallel_for(0, B * nh, 1, [&](int64_t begin, int64_t end) {
    TaskThreadState state;
    std::vector<float> scratch(T);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / nh, h = task % nh, g = h / rep;
      auto scores = probs.select(0, b).select(0, h);
      const auto q_h = head(q, b, h), k_g = head(k, b, g), v_g = head(v, b, g);
      auto y_h = head(y, b, h);
      for (int64_t r0 = 0; r0 < T; r0 += block) {
        const int64_t r1 = std::min(T, r0 + block), n = r1 - r0;
        auto visible = rows(scores, r0, n).narrow(1, 0, r1);
        at::mm_out(visible, rows(q_h, r0, n), rows(k_g, 0, r1).t());
        softmax_rows(scores, r0, r1, scale, scratch);
        auto out = rows(y_h, r0, n);
        at::mm_out(out, visible, rows(v_g, 0, r1));
      }
    }
  });
}

// dq, dk, dv (B, T, heads, hs), every element written. One task per
// (batch, key/value head): the query heads sharing it add into its dk and
// dv one after another, so no two threads write the same rows. dq goes by
// blocks of query rows, as forward; dk and dv by blocks of key columns
// [c0, c1), which only queries [c0, T) see.
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs, const Tensor& dy,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  RECORD_USER_SCOPE("fsdp::causal_attention_backward");
  const int64_t B = q.size(0), T = q.size(1), nh = q.size(2), nkv = k.size(2), rep = nh / nkv;
  const float scale = softmax_scale(q);
  const int64_t block = query_block(q);
  at::parallel_for(0, B * nkv, 1, [&](int64_t begin, int64_t end) {
    TaskThreadState state;
    std::vector<float> scratch(T);
    auto dscores = at::empty({T, T}, probs.options());
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / nkv, g = task % nkv;
      const auto k_g = head(k, b, g), v_g = head(v, b, g);
      auto dk_g = head(dk, b, g), dv_g = head(dv, b, g);
      for (int64_t r = 0; r < rep; ++r) {
        const int64_t h = g * rep + r;
        const auto p = probs.select(0, b).select(0, h), dy_h = head(dy, b, h), q_h = head(q, b, h);
        auto dq_h = head(dq, b, h);
        for (int64_t r0 = 0; r0 < T; r0 += block) {
          const int64_t r1 = std::min(T, r0 + block), n = r1 - r0;
          auto visible = rows(dscores, r0, n).narrow(1, 0, r1);
          at::mm_out(visible, rows(dy_h, r0, n), rows(v_g, 0, r1).t());
          softmax_backward_rows(p, dscores, r0, r1, scale, scratch);
          auto dq_rows = rows(dq_h, r0, n);
          at::mm_out(dq_rows, visible, rows(k_g, 0, r1));
        }
        for (int64_t c0 = 0; c0 < T; c0 += block) {
          const int64_t n = std::min(T, c0 + block) - c0, below = T - c0;
          const auto p_cols = rows(p, c0, below).narrow(1, c0, n);
          const auto ds_cols = rows(dscores, c0, below).narrow(1, c0, n);
          auto dv_rows = rows(dv_g, c0, n), dk_rows = rows(dk_g, c0, n);
          if (r == 0) {
            at::mm_out(dv_rows, p_cols.t(), rows(dy_h, c0, below));
            at::mm_out(dk_rows, ds_cols.t(), rows(q_h, c0, below));
          } else {
            dv_rows.addmm_(p_cols.t(), rows(dy_h, c0, below));
            dk_rows.addmm_(ds_cols.t(), rows(q_h, c0, below));
          }
        }
      }
    }
  });
}

// The (B, T, heads, hs) views need unit stride along hs for BLAS.
Tensor unit_last_stride(const Tensor& t) { return t.stride(3) == 1 ? t : t.contiguous(); }

void check_heads(const Tensor& q, const Tensor& k, const Tensor& v) {
  FSDP_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "causal_attention: q, k and v must be (B, T, heads, hs)");
  FSDP_CHECK(k.sizes() == v.sizes() && q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3),
             "causal_attention: q ", q.sizes(), ", k ", k.sizes(), " and v ", v.sizes(), " do not match");
  FSDP_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, "causal_attention: ", q.size(2),
             " query heads are not a multiple of ", k.size(2), " key/value heads");
}

struct CausalAttention : public torch::autograd::Function<CausalAttention> {
  static Tensor forward(AutogradContext* ctx, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in) {
    const auto q = unit_last_stride(q_in), k = unit_last_stride(k_in), v = unit_last_stride(v_in);
    const int64_t B = q.size(0), T = q.size(1), nh = q.size(2), hs = q.size(3);
    auto probs = at::empty({B, nh, T, T}, q.options());
    auto y = at::empty({B, T, nh, hs}, q.options());
    attention_forward(q, k, v, probs, y);
    ctx->save_for_backward({q, k, v, probs});
    return y.view({B, T, nh * hs});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &probs = saved[3];
    const auto dy = grad_outputs[0].to(q.scalar_type()).contiguous().view(q.sizes());
    auto dq = at::empty(q.sizes(), q.options()), dk = at::empty(k.sizes(), k.options());
    auto dv = at::empty(v.sizes(), v.options());
    attention_backward(q, k, v, probs, dy, dq, dk, dv);
    return {dq, dk, dv};
  }
};

// qkv (B, T, 3 * nh * hs) seen as (B, T, 3, nh, hs): part i is q, k or v.
Tensor packed_part(const Tensor& qkv, int64_t n_head, int64_t i) {
  const int64_t B = qkv.size(0), T = qkv.size(1), hs = qkv.size(2) / (3 * n_head);
  return qkv.reshape({B, T, 3, n_head, hs}).select(2, i);
}

struct PackedCausalAttention : public torch::autograd::Function<PackedCausalAttention> {
  static Tensor forward(AutogradContext* ctx, const Tensor& qkv_in, int64_t n_head) {
    const auto qkv = qkv_in.contiguous();
    const auto q = packed_part(qkv, n_head, 0);
    const int64_t B = q.size(0), T = q.size(1), hs = q.size(3);
    auto probs = at::empty({B, n_head, T, T}, q.options());
    auto y = at::empty({B, T, n_head, hs}, q.options());
    attention_forward(q, packed_part(qkv, n_head, 1), packed_part(qkv, n_head, 2), probs, y);
    ctx->save_for_backward({qkv, probs});
    ctx->saved_data["n_head"] = n_head;
    return y.view({B, T, n_head * hs});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &qkv = saved[0], &probs = saved[1];
    const int64_t n_head = ctx->saved_data["n_head"].toInt();
    const auto q = packed_part(qkv, n_head, 0);
    const auto dy = grad_outputs[0].to(qkv.scalar_type()).contiguous().view(q.sizes());
    auto dqkv = at::empty(qkv.sizes(), qkv.options());
    attention_backward(q, packed_part(qkv, n_head, 1), packed_part(qkv, n_head, 2), probs, dy,
                       packed_part(dqkv, n_head, 0), packed_part(dqkv, n_head, 1), packed_part(dqkv, n_head, 2));
    return {dqkv, Tensor()};
  }
};

// On a GPU, LibTorch's fused attention (flash, cuDNN or memory-efficient,
// as it chooses): no (T, T) matrix in memory, dropout inside the kernel
// (drawn from the device's generator, which checkpointing replays).
Tensor device_attention(const Tensor& q, const Tensor& k, const Tensor& v, torch::nn::Dropout* dropout) {
  const int64_t B = q.size(0), T = q.size(1), nh = q.size(2), hs = q.size(3);
  auto qh = q.transpose(1, 2), kh = k.transpose(1, 2), vh = v.transpose(1, 2);  // (B, heads, T, hs)
  const double p = dropout_active(dropout) ? (*dropout)->options.p() : 0.0;
#if FSDP_TORCH_VERSION >= 205
  const bool grouped = nh != k.size(2);
  auto y = at::scaled_dot_product_attention(qh, kh, vh, /*attn_mask=*/{}, p, /*is_causal=*/true, /*scale=*/{},
                                            /*enable_gqa=*/grouped);
#elif FSDP_TORCH_VERSION >= 200
  if (const int64_t rep = nh / k.size(2); rep > 1) {
    kh = kh.repeat_interleave(rep, 1);
    vh = vh.repeat_interleave(rep, 1);
  }
  auto y = at::scaled_dot_product_attention(qh, kh, vh, /*attn_mask=*/{}, p, /*is_causal=*/true);
#else
  (void)p;
  auto y = composite_attention(q, k, v, dropout).view({B, T, nh, hs}).transpose(1, 2);  // never reached: see on_gpu
#endif
  return y.transpose(1, 2).reshape({B, T, nh * hs});
}

bool on_gpu(const Tensor& t) {
#if FSDP_TORCH_VERSION >= 200
  return t.is_cuda();
#else
  (void)t;
  return false;  // LibTorch 1.13 has no fused attention; its CPU build has no GPU
#endif
}

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, torch::nn::Dropout* dropout) {
  check_heads(q, k, v);
  if (on_gpu(q)) return device_attention(q, k, v, dropout);
  if (!fused(q, dropout) || k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) {
    return composite_attention(q, k, v, dropout);
  }
  return CausalAttention::apply(q, k, v);
}

Tensor causal_attention_packed(const Tensor& qkv, int64_t n_head, torch::nn::Dropout* dropout) {
  FSDP_CHECK(qkv.dim() == 3 && n_head > 0 && qkv.size(2) % (3 * n_head) == 0, "causal_attention_packed: qkv ",
             qkv.sizes(), " is not (B, T, 3 * ", n_head, " * head size)");
  if (on_gpu(qkv) || !fused(qkv, dropout)) {
    // unbind, not three selects: its backward writes dqkv with one stack,
    // where each select's would fill a zero qkv-sized tensor to be summed.
    const int64_t B = qkv.size(0), T = qkv.size(1), hs = qkv.size(2) / (3 * n_head);
    const auto parts = qkv.reshape({B, T, 3, n_head, hs}).unbind(2);
    return on_gpu(qkv) ? device_attention(parts[0], parts[1], parts[2], dropout)
                       : composite_attention(parts[0], parts[1], parts[2], dropout);
  }
  return PackedCausalAttention::apply(qkv, n_head);
}

}  // namespace fsdp::models
