#pragma once
// Choosing a configuration that fits a memory budget: every combination of
// sharding strategy, offload (none, the optimizer's state, or CPU offload),
// activation checkpointing, chunked loss, prefetch depth and micro-batch (with accumulation keeping the tokens per step) is
// predicted, and the one that fits with the least recomputation, then the
// largest micro-batch, then the least communication is chosen. Light
// header: no LibTorch.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/plan/memory_model.h"

namespace fsdp::plan {

struct Candidate {
  train::TrainConfig job;
  int64_t peak_bytes = 0;  // tensors at the peak with the headroom, plus the runtime overhead
  bool fits = false;
};

struct Choice {
  std::optional<Candidate> best;
  // The best of each (strategy, offload, checkpointing, chunked loss) group, in
  // preference order, the chosen one's group included; a group with no
  // fitting member shows its smallest.
  std::vector<Candidate> groups;
  Candidate smallest;  // the least memory of all
};

// A candidate fits when its tensors' peak times (1 + headroom), plus the
// overhead, is within the budget: the headroom stands for what an allocator
// keeps beyond live tensors (this project's CPU block cache, CUDA's
// reserved-over-allocated).
Choice choose(const ModelShape& model, const train::TrainConfig& job, int world, const Target& target,
              int64_t budget_bytes, int64_t overhead_bytes, double headroom);

int64_t with_headroom(int64_t tensor_bytes, double headroom);

// Why `other` ranks below `best` (both fit), or by how much it is over
// the budget: one phrase.
std::string why_not(const Candidate& other, const Candidate& best, int64_t budget_bytes);

// "--sharding full_shard --batch-size 2 --grad-accum 4 ...": the flags
// that set what `job` plans, for `fsdp train`.
std::string train_flags(const train::TrainConfig& job);

// "1.23 GiB", "456.0 MiB".
std::string format_bytes(int64_t bytes);

}  // namespace fsdp::plan
