#include "fsdp/bench/comm_bench.h"

#include <chrono>
#include <cstdio>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "fsdp/common/error.h"
#include "fsdp/distributed/collectives.h"

namespace fsdp::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Buffers and the expected result of one collective at one size. Rank r
// contributes values (r + 1) * (i % 7 + 1), small integers that every dtype
// represents exactly, so the expectation is exact too.
struct Case {
  at::Tensor input, output, expected;
};

at::Tensor pattern(int64_t n, double scale, at::ScalarType dtype) {
  return (at::arange(n, at::kLong).remainder(7) + 1).to(at::kDouble).mul(scale).to(dtype);
}

Case make_case(const std::string& op, int64_t count, int rank, int world, at::ScalarType dtype) {
  Case c;
  const double sum_of_ranks = world * (world + 1) / 2.0;  // sum of (r + 1)
  if (op == "all_gather") {
    const int64_t n = count / world;
    c.input = pattern(n, rank + 1, dtype);
    c.output = at::empty({count}, dtype);
    std::vector<at::Tensor> parts;
    for (int r = 0; r < world; ++r) parts.push_back(pattern(n, r + 1, dtype));
    c.expected = at::cat(parts);
  } else if (op == "reduce_scatter") {
    const int64_t n = count / world;
    c.input = pattern(count, rank + 1, dtype);
    c.output = at::empty({n}, dtype);
    c.expected = pattern(count, sum_of_ranks, dtype).narrow(0, rank * n, n);
  } else if (op == "all_reduce") {
    c.input = pattern(count, rank + 1, dtype);
    c.output = c.input;
    c.expected = pattern(count, sum_of_ranks, dtype);
  } else if (op == "broadcast") {
    c.input = rank == 0 ? pattern(count, 1, dtype) : at::zeros({count}, dtype);
    c.output = c.input;
    c.expected = pattern(count, 1, dtype);
  } else {
    throw Error("fsdp bench comm: unknown collective '" + op +
                "': expected all_gather, reduce_scatter, all_reduce or broadcast");
  }
  return c;
}

dist::Work issue(const std::string& op, dist::ProcessGroup& group, Case& c) {
  if (op == "all_gather") return dist::all_gather_into_tensor(group, c.output, c.input);
  if (op == "reduce_scatter") return dist::reduce_scatter_tensor(group, c.output, c.input);
  if (op == "all_reduce") return dist::all_reduce(group, c.input);
  return dist::broadcast(group, c.input, 0);
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float" || name == "fp32") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  throw Error("fsdp bench comm: --dtype '" + name + "': expected float or bfloat16");
}

void print_header(std::ostream& out, const std::string& op, const dist::ProcessGroup& group,
                  const CommBenchOptions& o) {
  char line[256];
  out << "#\n# " << op << ": nranks " << group.size() << ", backend " << dist::to_string(group.backend())
      << ", transport " << group.transport() << ", " << at::get_num_threads() << " intra-op thread(s)/rank, warmup " << o.warmup << ", iters "
      << o.iters << "\n#\n";
  std::snprintf(line, sizeof(line), "#%12s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %6s\n", "size", "count", "type",
                "redop", "root", "time", "algbw", "busbw", "#wrong");
  out << line;
  std::snprintf(line, sizeof(line), "#%12s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %6s\n", "(B)", "(elements)", "",
                "", "", "(us)", "(GB/s)", "(GB/s)", "");
  out << line;
}

}  // namespace

double bus_factor(const std::string& op, int world) {
  if (op == "all_reduce") return 2.0 * (world - 1) / world;
  if (op == "all_gather" || op == "reduce_scatter") return static_cast<double>(world - 1) / world;
  return 1.0;  // broadcast
}

std::vector<CommBenchRow> run_comm_bench(dist::ProcessGroup& group, const CommBenchOptions& o,
                                         std::ostream* out) {
  FSDP_CHECK(o.min_bytes > 0 && o.max_bytes >= o.min_bytes, "fsdp bench comm: sizes ", o.min_bytes, "..",
             o.max_bytes, ": expected 0 < min <= max");
  FSDP_CHECK(o.factor >= 2 && o.iters >= 1 && o.warmup >= 0,
             "fsdp bench comm: expected --factor >= 2, --iters >= 1, --warmup >= 0");
  const at::ScalarType dtype = parse_dtype(o.dtype);
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  const int world = group.size();
  const int rank = group.rank();
  const bool print = out != nullptr && rank == 0;
  std::vector<CommBenchRow> rows;

  for (const auto& op : o.ops) {
    make_case(op, world, rank, world, dtype);  // rejects an unknown name on every rank first
    if (print) print_header(*out, op, group, o);
    double busbw_sum = 0;
    int sizes = 0;
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
      // Counts are a multiple of the world size so that shards are equal.
      const int64_t count = std::max<int64_t>(world, bytes / elem / world * world);
      Case c = make_case(op, count, rank, world, dtype);
      for (int i = 0; i < o.warmup; ++i) issue(op, group, c).wait();
      dist::barrier(group);
      const auto start = Clock::now();
      std::vector<dist::Work> works;
      for (int i = 0; i < o.iters; ++i) works.push_back(issue(op, group, c));
      for (auto& w : works) w.wait();
      at::Tensor elapsed = at::full({1}, std::chrono::duration<double>(Clock::now() - start).count(), at::kDouble);
      dist::all_reduce(group, elapsed, dist::ReduceOp::kMax).wait();

      // A fresh, checked run: repeated in-place all-reduces change the data.
      c = make_case(op, count, rank, world, dtype);
      issue(op, group, c).wait();
      at::Tensor wrong = c.output.ne(c.expected).sum().to(at::kLong).reshape({1});
      dist::all_reduce(group, wrong, dist::ReduceOp::kSum).wait();

      CommBenchRow row;
      row.op = op;
      row.count = count;
      row.bytes = count * elem;
      row.time_us = elapsed.item<double>() / o.iters * 1e6;
      row.algbw_gbs = static_cast<double>(row.bytes) / (row.time_us * 1e-6) / 1e9;
      row.busbw_gbs = row.algbw_gbs * bus_factor(op, world);
      row.wrong = wrong.item<int64_t>();
      rows.push_back(row);
      busbw_sum += row.busbw_gbs;
      ++sizes;
      if (print) {
        char line[256];
        std::snprintf(line, sizeof(line), " %12lld  %12lld  %8s  %6s  %6d  %9.1f  %7.3f  %7.3f  %6lld\n",
                      static_cast<long long>(row.bytes), static_cast<long long>(row.count),
                      dtype == at::kFloat ? "float" : "bfloat16",
                      (op == "reduce_scatter" || op == "all_reduce") ? "sum" : "none", op == "broadcast" ? 0 : -1,
                      row.time_us, row.algbw_gbs, row.busbw_gbs, static_cast<long long>(row.wrong));
        *out << line << std::flush;
      }
    }
    if (print && sizes > 0) {
      char line[128];
      std::snprintf(line, sizeof(line), "# Avg bus bandwidth    : %.3f GB/s\n", busbw_sum / sizes);
      *out << line;
    }
  }
  return rows;
}

}  // namespace fsdp::bench
