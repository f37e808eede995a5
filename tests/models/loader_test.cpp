// The data-order contract: any world size sees the same global batch, so a
// run at W=2 reproduces W=1.

#include <gtest/gtest.h>

#include "fsdp/common/error.h"
#include "fsdp/data/loader.h"

namespace fsdp::data {
namespace {

std::string token_file(const std::string& name, int64_t n, int32_t vocab) {
  const auto path = "/tmp/fsdp-loader-" + std::to_string(::getpid()) + "-" + name + ".bin";
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + 3) % vocab);
  write_token_file(path, tokens);
  return path;
}

TEST(DataOrder, TwoRanksTogetherReadWhatOneRankReads) {
  const auto path = token_file("order", 1000, 100);
  const int64_t B = 2, T = 8;
  // W=1 with batch 2B and one micro-step versus W=2 with batch B: the same rows.
  for (int A : {1, 2}) {
    DataLoader one(path, B * 2, T, 0, 1, A, 100, 0);
    DataLoader r0(path, B, T, 0, 2, A, 100, 0), r1(path, B, T, 1, 2, A, 100, 0);
    for (int64_t step = 0; step < 40; ++step) {  // 40 steps wrap around the file
      for (int a = 0; a < A; ++a) {
        const auto whole = one.batch(step, a);
        const auto b0 = r0.batch(step, a), b1 = r1.batch(step, a);
        EXPECT_TRUE(torch::cat({b0.inputs, b1.inputs}).equal(whole.inputs)) << "step " << step << " micro " << a;
        EXPECT_TRUE(torch::cat({b0.targets, b1.targets}).equal(whole.targets)) << "step " << step << " micro " << a;
      }
    }
  }
}

TEST(DataOrder, OffsetsFollowTheFormulaAndTargetsAreShiftedInputs) {
  const auto path = token_file("formula", 5000, 100);
  const int64_t B = 3, T = 5;
  DataLoader loader(path, B, T, 1, 4, 2, 100, 0);
  EXPECT_EQ(loader.offset(3, 1), ((3 * 2 + 1) * 4 + 1) * B * T);
  const auto batch = loader.batch(3, 1);
  const int64_t start = loader.offset(3, 1);
  for (int64_t i = 0; i < B * T; ++i) {
    EXPECT_EQ(batch.inputs.view({-1})[i].item<int64_t>(), ((start + i) * 7 + 3) % 100);
    EXPECT_EQ(batch.targets.view({-1})[i].item<int64_t>(), ((start + i + 1) * 7 + 3) % 100);
  }
}

TEST(DataOrder, TokenIdsBeyondTheVocabularyAreRejected) {
  const auto path = token_file("vocab", 1000, 300);
  try {
    DataLoader loader(path, 2, 8, 0, 1, 1, 256, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 299"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("vocabulary of 256"), std::string::npos) << e.what();
  }
}

TEST(DataOrder, SyntheticDataKeepsTheContractToo) {
  DataLoader one(std::string("synthetic"), 4, 8, 0, 1, 1, 100, 9);
  DataLoader r0(std::string("synthetic"), 2, 8, 0, 2, 1, 100, 9), r1(std::string("synthetic"), 2, 8, 1, 2, 1, 100, 9);
  for (int64_t step = 0; step < 5; ++step) {
    EXPECT_TRUE(torch::cat({r0.batch(step, 0).inputs, r1.batch(step, 0).inputs}).equal(one.batch(step, 0).inputs));
  }
}

TEST(DataOrder, SyntheticDataDiffersByRankAndRepeatsBySeed) {
  DataLoader a(std::string("synthetic"), 2, 8, 0, 2, 1, 100, 5), b(std::string("synthetic"), 2, 8, 1, 2, 1, 100, 5);
  DataLoader a_again(std::string("synthetic"), 2, 8, 0, 2, 1, 100, 5);
  EXPECT_FALSE(a.batch(0, 0).inputs.equal(b.batch(0, 0).inputs));
  EXPECT_TRUE(a.batch(4, 0).inputs.equal(a_again.batch(4, 0).inputs));
  EXPECT_LT(a.batch(0, 0).inputs.max().item<int64_t>(), 100);
}

}  // namespace
}  // namespace fsdp::data
