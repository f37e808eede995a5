#pragma once
// Model state dicts as FSDP2 users call them (torch.distributed.checkpoint.
// state_dict's get_model_state_dict / set_model_state_dict), for a module
// sharded by fully_shard, replicated, or neither:
//
//   full     every parameter whole and every buffer, on the CPU, gathered on
//            every rank and written by rank 0 as one safetensors file that
//            an unsharded LibTorch module (load_full_state_dict) and
//            Python's `safetensors` read;
//   sharded  each rank's own ranges: local_shards (core/fully_shard.h).
//
// and the optimizer's twins (get_optimizer_state_dict / set_optimizer_state_dict):
//
//   full     each parameter's state tensors whole, as "<tensor>/<fqn>"
//            ("exp_avg/b0.fc.weight"), with the optimizer's kind, each
//            group's hyperparameters and parameters, and each parameter's
//            step count as the file's metadata (a JSON "fsdp.optimizer");
//   sharded  each rank's optimizer itself: its state tensors are shaped
//            like its parameters' shards, as LibTorch keeps them.
//
// torch::save(module) and torch::load of a sharded module are refused,
// naming these: its parameters hold this rank's 1-D shards.

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "fsdp/distributed/process_group.h"

namespace fsdp::checkpoint {

// Collective: every parameter's full value (tied ones once, under their
// first name) and every buffer (this rank's), on the CPU, in the order of
// root.named_parameters() then root.named_buffers().
std::vector<std::pair<std::string, at::Tensor>> full_state_dict(torch::nn::Module& root);

// Collective: full_state_dict written by rank 0 to `path` (safetensors,
// atomically: a crash leaves the earlier file or none). Throws on every
// rank when rank 0 cannot write it.
void save_full_state_dict(torch::nn::Module& root, const std::string& path, dist::World& world);

// Not collective: each rank reads `path` and keeps what it holds of each
// parameter (its shard under fully_shard, all of it otherwise), and every
// buffer. Throws fsdp::Error naming the key and both sides for a key the
// module lacks or the file lacks, and for another shape; nothing is
// written then. dtypes convert to the module's.
void load_full_state_dict(torch::nn::Module& root, const std::string& path);

// Collective: `optimizer`'s state over `root`'s parameters, whole, on the
// CPU (tensors), and what it describes (description: kind, groups with
// their options and parameter names, each parameter's step and tensors).
// Throws fsdp::Error, on every rank, for an optimizer of a kind checkpoints
// do not hold or one stepping a parameter `root` lacks.
struct FullOptimizerState {
  nlohmann::json description;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};
FullOptimizerState full_optimizer_state_dict(torch::nn::Module& root, torch::optim::Optimizer& optimizer,
                                             dist::World& world);

// Collective: full_optimizer_state_dict written by rank 0 to `path`, as
// save_full_state_dict writes the model's.
void save_full_optimizer_state_dict(torch::nn::Module& root, torch::optim::Optimizer& optimizer,
                                    const std::string& path, dist::World& world);

// Not collective: each rank puts into `optimizer` its part of every saved
// state tensor (shaped like its shard of the parameter), each step count
// and each group's hyperparameters. Throws fsdp::Error naming both sides,
// before anything changes, for another kind, other groups or parameters,
// or a tensor missing or of another shape.
void load_full_optimizer_state_dict(torch::nn::Module& root, torch::optim::Optimizer& optimizer,
                                    const std::string& path);

}  // namespace fsdp::checkpoint
