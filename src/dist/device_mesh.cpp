#include "fsdp/dist/device_mesh.h"

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

}  // namespace fsdp::dist
