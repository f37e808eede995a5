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

void check_reshard_after_forward(ReshardAfterForward reshard, int shard_group_size) {
  FSDP_CHECK(reshard.fits(shard_group_size), "reshard_after_forward=", reshard.ranks,
             ": the number of ranks to keep the parameters sharded over after forward must divide the shard "
             "group's size, ", shard_group_size, " (true frees them, false keeps them gathered)");
}

void validate(const FullyShardOptions& o) {
  FSDP_CHECK(o.mesh != nullptr, "fully_shard: FullyShardOptions::mesh is not set: build one with fsdp::make_mesh");
  FSDP_CHECK(o.prefetch_depth >= 0, "fully_shard: prefetch_depth ", o.prefetch_depth, ": expected >= 0");
  const auto& layout = o.mesh->layout();
  FSDP_CHECK(o.strategy != ShardingStrategy::kNoShard || layout.shard == 1,
             "fully_shard: no_shard replicates every parameter, so the mesh must have shard size 1; it has ",
             layout.shard, " (use fsdp::make_mesh(world, ShardingStrategy::kNoShard))");
  // Before any parameter moves into a shard (the setter checks it again).
  if (o.reshard_after_forward) check_reshard_after_forward(*o.reshard_after_forward, layout.shard);
}

}  // namespace fsdp
