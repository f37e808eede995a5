#pragma once
// DeviceMesh: the world arranged as 1-D (shard) or 2-D (replicate x shard,
// for HSDP), with one process group per dimension for this rank.

#include <map>
#include <memory>
#include <string>

#include "fsdp/distributed/mesh_layout.h"
#include "fsdp/distributed/process_group.h"

namespace fsdp::dist {

class DeviceMesh {
 public:
  // All ranks in one shard group (FSDP): replicate = 1.
  static DeviceMesh make_1d(const std::shared_ptr<World>& world);
  // replicate x shard = world size (HSDP). Validated on every rank before
  // any group is connected, so a bad shape fails everywhere, not as a hang.
  static DeviceMesh make_2d(const std::shared_ptr<World>& world, int replicate, int shard);

  const MeshLayout& layout() const { return layout_; }
  int ndim() const { return layout_.replicate == 1 ? 1 : 2; }
  // This rank's group along the shard dimension (within one replica).
  ProcessGroup& shard_group() const { return *shard_group_; }
  // This rank's group along the replicate dimension (size 1 for a 1-D mesh).
  ProcessGroup& replicate_group() const { return *replicate_group_; }
  World& world() const { return *world_; }
  // This rank's group of `ranks` consecutive members of its shard group
  // (`ranks` divides the shard group's size; equal to it: the shard group).
  // Made on first use, by every rank at the same point (each with its own
  // group's members), and kept with the mesh.
  ProcessGroup& shard_subgroup(int ranks) const;

 private:
  std::shared_ptr<World> world_;
  MeshLayout layout_;
  std::shared_ptr<ProcessGroup> shard_group_;
  std::shared_ptr<ProcessGroup> replicate_group_;
  // Shared by copies of the mesh, as the groups above are.
  std::shared_ptr<std::map<int, std::shared_ptr<ProcessGroup>>> shard_subgroups_ =
      std::make_shared<std::map<int, std::shared_ptr<ProcessGroup>>>();
};

}  // namespace fsdp::dist
