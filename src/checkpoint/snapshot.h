#pragma once
// A save in two halves: the snapshot, taken from the program's parts on the
// training thread (everything the save writes, and the table of who holds
// what), and the writing, which needs nothing of the program and so may
// run on another thread over a group of its own (checkpoint/async_save.h).

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/metadata.h"
#include "fsdp/checkpoint/parts.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/io/safetensors.h"

namespace fsdp::checkpoint::detail {

struct Snapshot {
  struct Param {
    std::string fqn;
    std::vector<int64_t> shape;  // global
    at::ScalarType dtype;
  };
  struct Optimizer {
    std::string name;
    std::string kind;
    std::vector<std::vector<size_t>> groups;  // per parameter group, indices into `params`
    std::vector<nlohmann::json> options;      // per parameter group
  };
  TrainerState state;
  ShardingRecord sharding;
  bool frozen_left_out = false;
  std::vector<Param> params;
  std::vector<Optimizer> optimizers;
  // This rank's file: what it writes, in order.
  std::vector<io::SafetensorsWriter::Spec> specs;
  std::vector<at::Tensor> tensors;
  at::Tensor table;  // [params, columns] int64: what rank 0 needs to know of this rank's file
  // Rank 0 only: the buffers it writes and the Stateful parts' JSON.
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  nlohmann::json states;
};

// A save's snapshot: everything it writes, taken from the parts at once,
// so that writing needs nothing of the program (detail::Snapshot). Per
// parameter the table holds (begin, count, writes), then per optimizer
// (has state, step, which state tensors: a bit per optimizer_state_tensors
// entry); rank 0 gathers every rank's to build the metadata.
constexpr int64_t kShardColumns = 3, kOptimizerColumns = 3;

// Throws fsdp::Error for parts that cannot be saved, before anything is
// written. `copy`: every tensor is copied to host memory, so the program
// may train on while the snapshot is written; otherwise the snapshot
// refers to the program's own tensors.
std::shared_ptr<Snapshot> snapshot(const Parts& parts, const TrainerState& state, int rank, int world_size, bool copy);

// Collective over `world`: snapshot(), then every rank learns whether any
// failed (a refused part fails on every rank alike; a host copy that runs
// out of memory on one), so that none goes on to write alone.
std::shared_ptr<Snapshot> agreed_snapshot(const Parts& parts, const TrainerState& state, dist::World& world,
                                          bool copy);

// Collective over `group` (the ranks that took the snapshot, in the same
// order): writes, checksums and publishes. Returns the checkpoint's
// directory; throws SaveError on every rank when any rank failed.
std::string write_snapshot(const std::string& dir, int keep, const Snapshot& snap, dist::ProcessGroup& group);

}  // namespace fsdp::checkpoint::detail
