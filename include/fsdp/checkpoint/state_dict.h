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
// torch::save(module) on a sharded module writes this rank's 1-D shards,
// which torch::load then puts into an unsharded module without a word:
// save and load full state dicts instead, or checkpoints (checkpoint.h).

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "fsdp/dist/process_group.h"

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

}  // namespace fsdp::checkpoint
