#include "fsdp/distributed/mesh_layout.h"

#include <gtest/gtest.h>

#include "fsdp/common/error.h"

namespace fsdp::dist {
namespace {

TEST(MeshLayout, GroupsOfTwoByThree) {
  const MeshLayout m = MeshLayout::make(6, 2, 3);
  // Rank 4 sits at (1, 1): replica 1 holds ranks 3..5; shard index 1 is ranks 1 and 4.
  EXPECT_EQ(m.replicate_index(4), 1);
  EXPECT_EQ(m.shard_index(4), 1);
  EXPECT_EQ(m.shard_group(4), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(m.replicate_group(4), (std::vector<int>{1, 4}));
}

TEST(MeshLayout, EveryRankInExactlyOneGroupPerDimension) {
  const MeshLayout m = MeshLayout::make(12, 3, 4);
  for (int r = 0; r < 12; ++r) {
    for (int other : m.shard_group(r)) EXPECT_EQ(m.shard_group(other), m.shard_group(r));
    for (int other : m.replicate_group(r)) EXPECT_EQ(m.replicate_group(other), m.replicate_group(r));
    EXPECT_EQ(m.shard_group(r).size(), 4u);
    EXPECT_EQ(m.replicate_group(r).size(), 3u);
  }
}

TEST(MeshLayout, OneDimensional) {
  const MeshLayout m = MeshLayout::make(3, 1, 3);
  EXPECT_EQ(m.shard_group(2), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(m.replicate_group(2), (std::vector<int>{2}));
}

TEST(MeshLayout, ShapeMustMultiplyToWorldSize) {
  try {
    MeshLayout::make(4, 2, 3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 * 3 = 6 ranks but WORLD_SIZE is 4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fsdp::dist
