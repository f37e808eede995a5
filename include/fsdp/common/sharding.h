#pragma once
// How fully_shard splits a unit (FSDP1's ShardingStrategy, FSDP2's mesh
// and reshard_after_forward): one enum for the library, the trainer's
// configuration and the planner. Light header: no LibTorch.

#include "fsdp/common/enum_spellings.h"

namespace fsdp {

enum class ShardingStrategy {
  kFullShard,    // free gathered parameters after forward, gather again for backward
  kShardGradOp,  // keep them gathered from forward until the end of backward
  kNoShard,      // replicate; all-reduce gradients (DDP); needs a mesh with shard size 1
  kHybridShard,  // full shard inside each shard group, replicate across groups (2-D mesh)
};

template <>
struct EnumSpellings<ShardingStrategy> {
  static constexpr Spelling<ShardingStrategy> kTable[] = {{ShardingStrategy::kFullShard, "full_shard"},
                                                          {ShardingStrategy::kShardGradOp, "shard_grad_op"},
                                                          {ShardingStrategy::kNoShard, "no_shard"},
                                                          {ShardingStrategy::kHybridShard, "hybrid_shard"}};
};

inline const char* to_string(ShardingStrategy strategy) { return spelling_of(strategy); }

}  // namespace fsdp
