#include "fsdp/distributed/mesh_layout.h"

#include "fsdp/common/error.h"

namespace fsdp::dist {

MeshLayout MeshLayout::make(int world_size, int replicate, int shard) {
  FSDP_CHECK(replicate >= 1 && shard >= 1, "mesh shape (", replicate, ", ", shard,
             "): both dimensions must be at least 1");
  FSDP_CHECK(replicate * shard == world_size, "mesh shape (replicate=", replicate, ", shard=", shard,
             ") holds ", replicate, " * ", shard, " = ", replicate * shard, " ranks but WORLD_SIZE is ",
             world_size, ": choose a shard size that divides ", world_size);
  return MeshLayout{replicate, shard};
}

std::vector<int> MeshLayout::shard_group(int rank) const {
  std::vector<int> ranks;
  const int first = replicate_index(rank) * shard;
  for (int j = 0; j < shard; ++j) ranks.push_back(first + j);
  return ranks;
}

std::vector<int> MeshLayout::replicate_group(int rank) const {
  std::vector<int> ranks;
  for (int i = 0; i < replicate; ++i) ranks.push_back(i * shard + shard_index(rank));
  return ranks;
}

}  // namespace fsdp::dist
