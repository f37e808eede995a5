#pragma once
// What a checkpoint is made of, on both sides: what the program's parts
// hold (Contents, gathered once per save or load) and what a checkpoint's
// metadata says each optimizer saved (SavedOptimizer), with the names the
// optimizers' tensors are saved under.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>
#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/parts.h"
#include "fsdp/core/fully_shard.h"

namespace fsdp::checkpoint::detail {

// What the parts hold, gathered once per save or load: every model's
// parameters (as this rank holds them) and buffers under their checkpoint
// names, and every optimizer with its kind and its parameters' indices.
struct Contents {
  struct Optimizer {
    std::string name;
    torch::optim::Optimizer* optimizer = nullptr;
    std::string kind;
    std::vector<std::vector<size_t>> groups;  // per parameter group, indices into `shards`
  };
  std::vector<LocalShard> shards;
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  std::vector<Optimizer> optimizers;
  ShardingRecord sharding;
  bool frozen_left_out = false;  // Parts::leave_out_frozen
};

Contents contents_of(const Parts& parts, int world_size);

std::string optimizer_tensor_name(const std::string& optimizer, const std::string& tensor, const std::string& fqn);

// An optimizer a checkpoint holds, read from metadata of any version:
// versions 1 and 2 held the trainer's AdamW alone, as "optimizer", with its
// moments under "exp_avg/<fqn>" and no hyperparameters.
struct SavedOptimizer {
  std::string kind;
  const nlohmann::json* groups = nullptr;  // null: not saved
  struct State {
    int64_t step = 0;
    std::vector<std::string> tensors;
  };
  std::map<std::string, State> state;  // by parameter
  bool legacy = false;
  std::string tensor_name(const std::string& optimizer, const std::string& tensor, const std::string& fqn) const {
    return legacy ? tensor + "/" + fqn : optimizer_tensor_name(optimizer, tensor, fqn);
  }
};

std::map<std::string, SavedOptimizer> saved_optimizers(const nlohmann::json& meta);

}  // namespace fsdp::checkpoint::detail
