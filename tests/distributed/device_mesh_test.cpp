// Sub-groups of 1-D and 2-D meshes: a sum over each group equals the sum of
// its members' ranks computed from the mesh arithmetic.

#include "fsdp/distributed/device_mesh.h"

#include <gtest/gtest.h>

#include <numeric>

#include <ATen/ATen.h>

#include "dist_test_world.h"
#include "fsdp/common/error.h"
#include "fsdp/distributed/collectives.h"

namespace fsdp::dist::device_mesh_test {
namespace {

using fsdp::testing::test_world_ptr;

float sum_of_global_ranks(ProcessGroup& group, int my_global_rank) {
  at::Tensor t = at::full({1}, static_cast<float>(my_global_rank));
  all_reduce(group, t).wait();
  return t.item<float>();
}

float expected_sum(const std::vector<int>& ranks) { return static_cast<float>(std::accumulate(ranks.begin(), ranks.end(), 0)); }

TEST(DeviceMesh, EveryFactorisationOfTheWorld) {
  auto world = test_world_ptr();
  const int w = world->size();
  const int rank = world->rank();
  for (int replicate = 1; replicate <= w; ++replicate) {
    if (w % replicate != 0) continue;
    const DeviceMesh mesh = DeviceMesh::make_2d(world, replicate, w / replicate);
    EXPECT_EQ(mesh.shard_group().size(), w / replicate);
    EXPECT_EQ(mesh.replicate_group().size(), replicate);
    EXPECT_EQ(mesh.shard_group().rank(), mesh.layout().shard_index(rank));
    EXPECT_EQ(mesh.replicate_group().rank(), mesh.layout().replicate_index(rank));
    EXPECT_EQ(sum_of_global_ranks(mesh.shard_group(), rank), expected_sum(mesh.layout().shard_group(rank)))
        << replicate << "x" << w / replicate;
    EXPECT_EQ(sum_of_global_ranks(mesh.replicate_group(), rank), expected_sum(mesh.layout().replicate_group(rank)))
        << replicate << "x" << w / replicate;
  }
}

TEST(DeviceMesh, OneDimensionalIsTheWorld) {
  auto world = test_world_ptr();
  const DeviceMesh mesh = DeviceMesh::make_1d(world);
  EXPECT_EQ(mesh.ndim(), 1);
  EXPECT_EQ(mesh.shard_group().size(), world->size());
  EXPECT_EQ(mesh.replicate_group().size(), 1);
}

TEST(DeviceMesh, BadShapeFailsOnEveryRankWithoutHanging) {
  auto world = test_world_ptr();
  try {
    DeviceMesh::make_2d(world, 2, world->size() + 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("but WORLD_SIZE is " + std::to_string(world->size())), std::string::npos)
        << e.what();
  }
  barrier(world->group());  // every rank got here: nobody is stuck in a collective
}

}  // namespace
}  // namespace fsdp::dist::device_mesh_test
