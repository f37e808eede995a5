#pragma once
// Rank arithmetic of a 2-D device mesh (replicate x shard), kept pure so it
// is testable on its own. Rank r sits at (r / shard, r % shard): ranks of
// one shard group are consecutive, as in PyTorch's DeviceMesh for HSDP, so a
// shard group stays inside one node when shard <= ranks per node.
// Light header: no LibTorch.

#include <vector>

namespace fsdp::dist {

struct MeshLayout {
  int replicate = 1;  // number of replicas (dim 0)
  int shard = 1;      // ranks per shard group (dim 1)

  // Throws fsdp::Error showing the arithmetic when replicate * shard != world_size.
  static MeshLayout make(int world_size, int replicate, int shard);

  int size() const { return replicate * shard; }
  int replicate_index(int rank) const { return rank / shard; }
  int shard_index(int rank) const { return rank % shard; }
  // Members of `rank`'s shard group (same replica), ascending.
  std::vector<int> shard_group(int rank) const;
  // Members of `rank`'s replicate group (same shard index), ascending.
  std::vector<int> replicate_group(int rank) const;
};

}  // namespace fsdp::dist
