#include "fsdp/distributed/device_mesh.h"

#include <vector>

#include "fsdp/common/error.h"

namespace fsdp::dist {

DeviceMesh DeviceMesh::make_1d(const std::shared_ptr<World>& world) {
  return make_2d(world, 1, world->size());
}

DeviceMesh DeviceMesh::make_2d(const std::shared_ptr<World>& world, int replicate, int shard) {
  DeviceMesh mesh;
  mesh.world_ = world;
  mesh.layout_ = MeshLayout::make(world->size(), replicate, shard);
  const int rank = world->rank();
  const auto shard_ranks = mesh.layout_.shard_group(rank);
  const auto replicate_ranks = mesh.layout_.replicate_group(rank);
  // Group names carry the mesh shape and the group's index so that every
  // group in the job has its own store prefix.
  const std::string shape = std::to_string(replicate) + "x" + std::to_string(shard);
  mesh.shard_group_ = shard == world->size()
                          ? std::shared_ptr<ProcessGroup>(world, &world->group())
                          : world->new_group("mesh" + shape + "/shard" +
                                                 std::to_string(mesh.layout_.replicate_index(rank)),
                                             shard_ranks, "mesh" + shape + "/shard");
  mesh.replicate_group_ =
      replicate == world->size()
          ? std::shared_ptr<ProcessGroup>(world, &world->group())
          : world->new_group("mesh" + shape + "/replicate" + std::to_string(mesh.layout_.shard_index(rank)),
                             replicate_ranks, "mesh" + shape + "/replicate");
  return mesh;
}

ProcessGroup& DeviceMesh::shard_subgroup(int ranks) const {
  FSDP_CHECK(ranks >= 1 && layout_.shard % ranks == 0, "a group of ", ranks,
             " ranks inside the shard group: the number must divide the shard group's size ", layout_.shard);
  if (ranks == layout_.shard) return *shard_group_;
  auto& slot = (*shard_subgroups_)[ranks];
  if (!slot) {
    const int rank = world_->rank();
    const int first = rank - layout_.shard_index(rank) % ranks;
    std::vector<int> members;
    for (int i = 0; i < ranks; ++i) members.push_back(first + i);
    const std::string shape = std::to_string(layout_.replicate) + "x" + std::to_string(layout_.shard);
    const std::string role = "mesh" + shape + "/shard_by" + std::to_string(ranks);
    slot = world_->new_group(role + "/" + std::to_string(first / ranks), members, role);
  }
  return *slot;
}

}  // namespace fsdp::dist
