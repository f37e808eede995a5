#include "fsdp/core/shard_layout.h"

#include <gtest/gtest.h>

namespace fsdp {
namespace {

TEST(ShardLayout, ParameterStraddlingTwoShards) {
  // Flat buffer of 10 elements padded to 12 over 3 ranks (shards of 4);
  // a parameter at [3, 9) is split 1 / 4 / 1.
  EXPECT_EQ(shard_range(3, 6, 4, 0).numel, 1);
  EXPECT_EQ(shard_range(3, 6, 4, 0).begin_in_param, 0);
  EXPECT_EQ(shard_range(3, 6, 4, 0).begin_in_shard, 3);
  EXPECT_EQ(shard_range(3, 6, 4, 1).numel, 4);
  EXPECT_EQ(shard_range(3, 6, 4, 1).begin_in_param, 1);
  EXPECT_EQ(shard_range(3, 6, 4, 1).begin_in_shard, 0);
  EXPECT_EQ(shard_range(3, 6, 4, 2).numel, 1);
  EXPECT_EQ(shard_range(3, 6, 4, 2).begin_in_param, 5);
  EXPECT_EQ(shard_range(3, 6, 4, 2).begin_in_shard, 0);
}

TEST(ShardLayout, EveryElementHeldExactlyOnce) {
  for (int world = 1; world <= 5; ++world) {
    const int64_t total = 23, shard = (total + world - 1) / world;
    std::vector<int> held(total, 0);
    for (int64_t offset : {0, 5, 11}) {
      const int64_t numel = offset == 11 ? 12 : (offset == 5 ? 6 : 5);
      for (int r = 0; r < world; ++r) {
        const ShardRange s = shard_range(offset, numel, shard, r);
        for (int64_t i = 0; i < s.numel; ++i) held[static_cast<size_t>(offset + s.begin_in_param + i)]++;
      }
    }
    for (int64_t i = 0; i < total; ++i) EXPECT_EQ(held[static_cast<size_t>(i)], 1) << "world " << world << " element " << i;
  }
}

TEST(ShardLayout, ParameterOutsideTheShardIsEmpty) {
  EXPECT_EQ(shard_range(0, 3, 4, 1).numel, 0);
  EXPECT_EQ(shard_range(8, 4, 4, 0).numel, 0);
}

// reshard_after_forward = k keeps 1/k of the gathered buffer per rank, so
// k must divide the shard group (8 ranks: 1, 2, 4, 8; 0 is the whole group).
TEST(ShardLayout, ReshardRanksFitWhenTheyDivideTheShardGroup) {
  for (int64_t k = -1; k <= 9; ++k) {
    const bool divides = k == 1 || k == 2 || k == 4 || k == 8;
    EXPECT_EQ(reshard_ranks_fit(k, 8), k == 0 || divides) << "k = " << k;
  }
  EXPECT_TRUE(reshard_ranks_fit(0, 3));
  EXPECT_TRUE(reshard_ranks_fit(3, 3));
  EXPECT_FALSE(reshard_ranks_fit(2, 3));
}

}  // namespace
}  // namespace fsdp
