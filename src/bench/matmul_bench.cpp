#include "fsdp/bench/matmul_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <ATen/Parallel.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

namespace fsdp::bench {
namespace {

using Clock = std::chrono::steady_clock;

// A Linear's three products over M rows: the output, the input's gradient
// and the weight's. `weight_in_out` is GPT-2's Conv1D layout ([in, out]);
// otherwise the weight is [out, in] as torch::nn::Linear keeps it.
void add_linear(std::vector<Gemm>& out, const std::string& what, int64_t M, int64_t in, int64_t features,
                bool weight_in_out, int64_t count) {
  out.push_back({what + " forward", M, in, features, 1, false, !weight_in_out, count});
  out.push_back({what + " input grad", M, features, in, 1, false, weight_in_out, count});
  // [in, out] weights take x^T dy, [out, in] weights dy^T x.
  if (weight_in_out) {
    out.push_back({what + " weight grad", in, M, features, 1, true, false, count});
  } else {
    out.push_back({what + " weight grad", features, M, in, 1, true, false, count});
  }
}

at::Tensor operand(int64_t rows, int64_t cols, bool transposed, at::ScalarType dtype) {
  auto t = transposed ? at::randn({cols, rows}).t() : at::randn({rows, cols});
  return t.to(dtype);
}

// The best burst of running `product`, for at least `seconds` in all.
template <typename Product>
double best_time(const Product& product, double seconds) {
  product();  // warm up: packing buffers, the thread pool
  double best = 1e30;
  const auto start = Clock::now();
  for (int burst = 0; burst < 5 || std::chrono::duration<double>(Clock::now() - start).count() < seconds; ++burst) {
    int iters = 0;
    const auto burst_start = Clock::now();
    double elapsed = 0;
    do {
      product();
      ++iters;
      elapsed = std::chrono::duration<double>(Clock::now() - burst_start).count();
    } while (elapsed < seconds / 5);
    best = std::min(best, elapsed / iters);
  }
  return best;
}

GemmTiming time_gemm(const Gemm& g, at::ScalarType dtype, double seconds_per_gemm) {
  torch::NoGradGuard no_grad;
  at::Tensor a, b, c;
  if (g.batch > 1) {
    a = at::randn({g.batch, g.m, g.k}).to(dtype);
    b = at::randn({g.batch, g.k, g.n}).to(dtype);
    if (g.transpose_a) a = at::randn({g.batch, g.k, g.m}).to(dtype).transpose(1, 2);
    if (g.transpose_b) b = at::randn({g.batch, g.n, g.k}).to(dtype).transpose(1, 2);
    c = at::empty({g.batch, g.m, g.n}, a.options());
  } else {
    a = operand(g.m, g.k, g.transpose_a, dtype);
    b = operand(g.k, g.n, g.transpose_b, dtype);
    c = at::empty({g.m, g.n}, a.options());
  }
  GemmTiming timing{g, best_time([&] { g.batch > 1 ? at::bmm_out(c, a, b) : at::mm_out(c, a, b); }, seconds_per_gemm)};
  if (g.either_way && g.batch == 1) {
    // C^T (n x m) = op(B)^T op(A)^T, rows padded off a 4 KiB multiple as
    // nn::lm_loss pads the transposed logits.
    auto ct = at::empty({g.n, g.m + 64}, a.options()).narrow(1, 0, g.m);
    const double seconds = best_time([&] { at::mm_out(ct, b.t(), a.t()); }, seconds_per_gemm);
    if (seconds < timing.seconds) {
      timing.seconds = seconds;
      timing.transposed = true;
    }
  }
  return timing;
}

std::string shape_text(const Gemm& g) {
  char text[80];
  std::snprintf(text, sizeof(text), "%s%ldx%ldx%ld%s%s", g.batch > 1 ? (std::to_string(g.batch) + "*").c_str() : "",
                static_cast<long>(g.m), static_cast<long>(g.k), static_cast<long>(g.n), g.transpose_a ? " A^T" : "",
                g.transpose_b ? " B^T" : "");
  return g.either_way ? std::string(text) + " (or C^T)" : std::string(text);
}

}  // namespace

std::vector<Gemm> step_gemms(const plan::ModelShape& s, int64_t batch, int64_t seq_len, bool recompute) {
  const int64_t M = batch * seq_len, C = s.hidden, hd = s.head_dim;
  // Forward products run again in backward when blocks are recomputed.
  const int64_t forwards = s.layers * (recompute ? 2 : 1);
  // A routed layer's experts each compute their share of the N * k rows
  // (the expected load).
  std::vector<Gemm> out;
  for (const auto& p : s.projections) {
    const int64_t count = (p.layers > 0 ? p.layers : s.layers) * p.per_layer;
    const size_t first = out.size();
    add_linear(out, p.name, std::max<int64_t>(1, M * p.slots / p.per_layer), p.in, p.out, p.in_out, count);
    out[first].count = count * (recompute ? 2 : 1);
  }
  // Attention over the whole T x T square, per (sequence, query head).
  const int64_t bh = batch * s.heads, T = seq_len;
  out.push_back({"attention q k^T", T, hd, T, bh, false, true, forwards});
  out.push_back({"attention p v", T, T, hd, bh, false, false, forwards});
  out.push_back({"attention dp = dy v^T", T, hd, T, bh, false, true, s.layers});
  out.push_back({"attention dv = p^T dy", T, T, hd, bh, true, false, s.layers});
  out.push_back({"attention dq = ds k", T, T, hd, bh, false, false, s.layers});
  out.push_back({"attention dk = ds^T q", T, T, hd, bh, true, false, s.layers});
  // The head reads the [vocab, C] embedding (tied) or lm_head weight.
  add_linear(out, "head", M, C, s.vocab, false, 1);
  out[out.size() - 3].either_way = true;
  return out;
}

MatmulBenchResult run_matmul_bench(const std::vector<Gemm>& gemms, at::ScalarType dtype, double seconds_per_gemm) {
  MatmulBenchResult result;
  result.dtype = dtype;
  result.threads = at::get_num_threads();
  for (const auto& g : gemms) {
    GemmTiming row = time_gemm(g, dtype, seconds_per_gemm);
    result.step_flops += g.flops() * static_cast<double>(g.count);
    result.step_seconds += row.seconds * static_cast<double>(g.count);
    result.rows.push_back(row);
  }
  return result;
}

void print_matmul_bench(const MatmulBenchResult& r, std::ostream& out) {
  char line[256];
  std::snprintf(line, sizeof(line), "# %s, %d threads; each product the best burst of its timing\n",
                c10::toString(r.dtype), r.threads);
  out << line;
  std::snprintf(line, sizeof(line), "%-26s %-33s %6s %10s %12s\n", "product", "shape (m x k x n)", "count", "GFLOP/s",
                "ms per step");
  out << line;
  for (const auto& row : r.rows) {
    const std::string what = row.gemm.what + (row.transposed ? " as C^T" : "");
    std::snprintf(line, sizeof(line), "%-26s %-33s %6ld %10.1f %12.2f\n", what.c_str(), shape_text(row.gemm).c_str(),
                  static_cast<long>(row.gemm.count), row.flops_per_s() / 1e9,
                  row.seconds * static_cast<double>(row.gemm.count) * 1e3);
    out << line;
  }
  std::snprintf(line, sizeof(line),
                "step: %.2f GFLOP in matmuls; matmul-limited time %.3f s; sustained %.1f GFLOP/s over the step's "
                "shapes\n",
                r.step_flops / 1e9, r.step_seconds, r.rate() / 1e9);
  out << line;
}

nlohmann::json matmul_bench_json(const MatmulBenchResult& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows) {
    rows.push_back({{"product", row.gemm.what},
                    {"m", row.gemm.m},
                    {"k", row.gemm.k},
                    {"n", row.gemm.n},
                    {"batch", row.gemm.batch},
                    {"count", row.gemm.count},
                    {"as_transpose", row.transposed},
                    {"seconds", row.seconds},
                    {"flops_per_s", row.flops_per_s()}});
  }
  return {{"dtype", c10::toString(r.dtype)},    {"threads", r.threads},    {"step_flops", r.step_flops},
          {"matmul_limited_s", r.step_seconds}, {"flops_per_s", r.rate()}, {"products", rows}};
}

}  // namespace fsdp::bench
