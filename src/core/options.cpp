#include "fsdp/core/options.h"

#include <ATen/ATen.h>

#include "fsdp/common/error.h"

namespace fsdp {

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  if (const auto strategy = parse_spelling<ShardingStrategy>(name)) return *strategy;
  throw Error("unknown sharding strategy '" + name + "': expected " + spellings_text<ShardingStrategy>());
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
