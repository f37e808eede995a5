#pragma once
// `fsdp bench comm`: time each collective across message sizes and print the
// table the way nccl-tests does (size, count, type, redop, root, time,
// algorithm and bus bandwidth, wrong values).

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "fsdp/distributed/process_group.h"

namespace fsdp::bench {

struct CommBenchOptions {
  int64_t min_bytes = 1024;
  int64_t max_bytes = 64LL << 20;
  int factor = 4;
  int warmup = 3;
  int iters = 10;
  std::vector<std::string> ops{"all_gather", "reduce_scatter", "all_reduce", "broadcast"};
  std::string dtype = "float";  // float | bfloat16
};

struct CommBenchRow {
  std::string op;
  int64_t bytes = 0;
  int64_t count = 0;
  double time_us = 0;  // mean per operation, slowest rank
  double algbw_gbs = 0;
  double busbw_gbs = 0;
  int64_t wrong = 0;   // elements that differ from the locally computed expectation
};

// Bus bandwidth factor of each collective at `world` ranks (nccl-tests' PERFORMANCE.md).
double bus_factor(const std::string& op, int world);

// Collective over `group`; every rank returns the same rows; rank 0 prints.
std::vector<CommBenchRow> run_comm_bench(dist::ProcessGroup& group, const CommBenchOptions& options,
                                         std::ostream* out);

}  // namespace fsdp::bench
