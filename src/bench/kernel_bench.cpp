#include "fsdp/bench/kernel_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "fsdp/common/compat.h"
#include "fsdp/models/attention.h"
#include "fsdp/nn/layers.h"
#include "fsdp/optim/fused_adamw.h"

namespace fsdp::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The best of bursts of `run`, together at least `seconds` long: other
// work on the machine only ever slows a burst.
template <typename Run>
double best_seconds(const Run& run, double seconds) {
  run();
  double best = 1e30;
  const auto start = Clock::now();
  for (int burst = 0; burst < 3 || std::chrono::duration<double>(Clock::now() - start).count() < seconds; ++burst) {
    const auto t0 = Clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// One layer's attention, forward and backward, on (B, T, heads, hs) inputs.
KernelTiming time_attention(const plan::ModelShape& s, int64_t batch, int64_t seq_len, at::ScalarType dtype,
                            double seconds) {
  const auto options = at::TensorOptions().dtype(dtype);
  auto q = at::randn({batch, seq_len, s.heads, s.head_dim}).to(options).requires_grad_();
  auto k = at::randn({batch, seq_len, s.kv_heads, s.head_dim}).to(options).requires_grad_();
  auto v = at::randn({batch, seq_len, s.kv_heads, s.head_dim}).to(options).requires_grad_();
  const auto dy = at::randn({batch, seq_len, s.heads * s.head_dim}).to(options);
  KernelTiming t;
  t.kernel = std::string("causal attention forward+backward, ") + c10::toString(dtype);
  const double layers = static_cast<double>(s.layers);
  t.ours_s = layers * best_seconds(
                          [&] {
                            auto y = models::causal_attention(q, k, v);
                            y.backward(dy);
                            q.mutable_grad() = k.mutable_grad() = v.mutable_grad() = at::Tensor();
                          },
                          seconds);
#if FSDP_BENCH_HAS_ATEN_KERNELS
  t.aten_operator = "at::scaled_dot_product_attention";
  const bool gqa = s.kv_heads != s.heads;
  t.aten_s =
      layers * best_seconds(
                   [&] {
                     // The models' layout: (B, heads, T, hs) views of (B, T, heads, hs).
                     auto y = at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                               {}, 0.0, /*is_causal=*/true, std::nullopt, gqa);
                     y.transpose(1, 2).reshape({batch, seq_len, -1}).backward(dy);
                     q.mutable_grad() = k.mutable_grad() = v.mutable_grad() = at::Tensor();
                   },
                   seconds);
#endif
  return t;
}

// Every RMS norm of a step (two a block, then the final one), forward and
// backward, on (B * T, C) rows.
KernelTiming time_rms_norm(const plan::ModelShape& s, int64_t rows, at::ScalarType dtype, double seconds) {
  const auto options = at::TensorOptions().dtype(dtype);
  auto x = at::randn({rows, s.hidden}).to(options).requires_grad_();
  auto w = (at::randn({s.hidden}) * 0.1 + 1).to(options).requires_grad_();
  const auto dy = at::randn({rows, s.hidden}).to(options);
  const auto clear = [&] { x.mutable_grad() = w.mutable_grad() = at::Tensor(); };
  KernelTiming t;
  t.kernel = std::string("RMS norm forward+backward, ") + c10::toString(dtype);
  const double norms = static_cast<double>(2 * s.layers + 1);
  t.ours_s = norms * best_seconds(
                         [&] {
                           nn::rms_norm_rows(x, w, 1e-6).backward(dy);
                           clear();
                         },
                         seconds);
#if FSDP_BENCH_HAS_ATEN_KERNELS
  t.aten_operator = "at::rms_norm";
  t.aten_s = norms * best_seconds(
                         [&] {
                           at::rms_norm(x, {s.hidden}, w, 1e-6).backward(dy);
                           clear();
                         },
                         seconds);
#endif
  return t;
}

// Every block's SwiGLU activation, silu(gate) * up, forward and backward,
// on (B * T, ffn) inputs; LibTorch's side is its two operators.
KernelTiming time_swiglu(const plan::ModelShape& s, int64_t rows, at::ScalarType dtype, double seconds) {
  const auto options = at::TensorOptions().dtype(dtype);
  auto gate = at::randn({rows, s.ffn}).to(options).requires_grad_();
  auto up = at::randn({rows, s.ffn}).to(options).requires_grad_();
  const auto dy = at::randn({rows, s.ffn}).to(options);
  const auto clear = [&] { gate.mutable_grad() = up.mutable_grad() = at::Tensor(); };
  KernelTiming t;
  t.kernel = std::string("SwiGLU activation forward+backward, ") + c10::toString(dtype);
  const double layers = static_cast<double>(s.layers);
  t.ours_s = layers * best_seconds(
                          [&] {
                            nn::silu_mul(gate, up).backward(dy);
                            clear();
                          },
                          seconds);
  t.aten_operator = "at::silu, at::mul";
  t.aten_s = layers * best_seconds(
                          [&] {
                            (at::silu(gate) * up).backward(dy);
                            clear();
                          },
                          seconds);
  return t;
}

// One AdamW step over the model's parameters, one tensor per FSDP unit
// (each block, then the root), as the trainer's optimizer sees them.
KernelTiming time_adamw(const plan::ModelShape& s, double seconds) {
  std::vector<at::Tensor> params, grads;
  int64_t total = 0;
  for (int64_t i = 0; i <= s.layers; ++i) {
    params.push_back(at::randn({i < s.layers ? s.block_params[static_cast<size_t>(i)] : s.root_params}) * 0.02);
    grads.push_back(at::randn_like(params.back()) * 1e-3);
    total += params.back().numel();
  }
  KernelTiming t;
  t.kernel = "AdamW step, fp32, " + std::to_string(total / 1000000) + "M parameters";
  const auto options = torch::optim::AdamWOptions(3e-4).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
  std::vector<at::Tensor> ours_params;
  for (size_t i = 0; i < params.size(); ++i) {
    ours_params.push_back(params[i].clone());
    ours_params.back().mutable_grad() = grads[i];
  }
  optim::FusedAdamW ours(ours_params, options);
  t.ours_s = best_seconds([&] { ours.step(); }, seconds);
#if FSDP_BENCH_HAS_ATEN_KERNELS
  t.aten_operator = "at::_fused_adamw_";
  std::vector<at::Tensor> exp_avg, exp_avg_sq, steps;
  for (const auto& p : params) {
    exp_avg.push_back(at::zeros_like(p));
    exp_avg_sq.push_back(at::zeros_like(p));
    steps.push_back(at::zeros({}));
  }
  t.aten_s = best_seconds(
      [&] {
        for (auto& step : steps) step.add_(1);
        at::_fused_adamw_(params, grads, exp_avg, exp_avg_sq, {}, steps, 3e-4, 0.9, 0.95, 0.1, 1e-8,
                          /*amsgrad=*/false, /*maximize=*/false);
      },
      seconds);
#endif
  return t;
}

}  // namespace

std::vector<KernelTiming> run_kernel_bench(const plan::ModelShape& shape, int64_t batch, int64_t seq_len,
                                           double seconds_per_kernel) {
  torch::NoGradGuard no_grad_outside;  // the optimizers' steps
  std::vector<KernelTiming> rows;
  {
    at::AutoGradMode grad(true);
    rows.push_back(time_attention(shape, batch, seq_len, at::kFloat, seconds_per_kernel));
    rows.push_back(time_attention(shape, batch, seq_len, at::kBFloat16, seconds_per_kernel));
    // The Llama-like families: RMS norms and a SwiGLU MLP (GPT-2's are
    // LayerNorm and GELU).
    if (!shape.layer_norm) {
      for (const auto dtype : {at::kFloat, at::kBFloat16}) {
        rows.push_back(time_rms_norm(shape, batch * seq_len, dtype, seconds_per_kernel));
      }
      for (const auto dtype : {at::kFloat, at::kBFloat16}) {
        rows.push_back(time_swiglu(shape, batch * seq_len, dtype, seconds_per_kernel));
      }
    }
  }
  rows.push_back(time_adamw(shape, seconds_per_kernel));
  return rows;
}

void print_kernel_bench(const std::vector<KernelTiming>& rows, std::ostream& out) {
  char line[256];
  std::snprintf(line, sizeof(line), "# %d threads; per training step, the best of several runs\n",
                at::get_num_threads());
  out << line;
  std::snprintf(line, sizeof(line), "%-52s %10s %10s  %s\n", "kernel", "ours ms", "ATen ms", "ATen operator");
  out << line;
  for (const auto& r : rows) {
    char aten[32] = "-";
    if (r.aten_s >= 0) std::snprintf(aten, sizeof(aten), "%.2f", r.aten_s * 1e3);
    std::snprintf(line, sizeof(line), "%-52s %10.2f %10s  %s\n", r.kernel.c_str(), r.ours_s * 1e3, aten,
                  r.aten_operator.empty() ? "(none in this LibTorch)" : r.aten_operator.c_str());
    out << line;
  }
}

}  // namespace fsdp::bench
