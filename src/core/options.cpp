#include "fsdp/core/options.h"

#include <algorithm>
#include <cctype>

#include <ATen/ATen.h>

#include "fsdp/common/error.h"

namespace fsdp {

const char* to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::kFullShard: return "full_shard";
    case ShardingStrategy::kShardGradOp: return "shard_grad_op";
    case ShardingStrategy::kNoShard: return "no_shard";
    case ShardingStrategy::kHybridShard: return "hybrid_shard";
  }
  return "?";
}

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (auto s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard,
                 ShardingStrategy::kHybridShard}) {
    if (lower == to_string(s)) return s;
  }
  throw Error("unknown sharding strategy '" + name +
              "': expected full_shard, shard_grad_op, no_shard or hybrid_shard");
}

dist::DeviceMesh make_mesh(const std::shared_ptr<dist::World>& world, ShardingStrategy strategy, int fsdp_size) {
  const int w = world->size();
  switch (strategy) {
    case ShardingStrategy::kNoShard:
      return dist::DeviceMesh::make_2d(world, w, 1);
    case ShardingStrategy::kHybridShard:
      FSDP_CHECK(fsdp_size >= 1, "hybrid_shard needs a shard-group size (fsdp_size), got ", fsdp_size);
      FSDP_CHECK(w % fsdp_size == 0, "hybrid_shard: fsdp_size ", fsdp_size, " does not divide WORLD_SIZE ", w,
                 ": replicate(", w, " / ", fsdp_size, ") * shard(", fsdp_size, ") must equal WORLD_SIZE(", w, ")");
      return dist::DeviceMesh::make_2d(world, w / fsdp_size, fsdp_size);
    case ShardingStrategy::kFullShard:
    case ShardingStrategy::kShardGradOp:
      break;
  }
  return dist::DeviceMesh::make_1d(world);
}

}  // namespace fsdp
