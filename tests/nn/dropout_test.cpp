// fsdp::nn::dropout's counter-based masks: the fraction dropped against p
// (bounds of five standard deviations of a Bernoulli count), the kept
// values against x / (1 - p) computed by LibTorch, independence between
// neighbours and between keys, backward applying the forward's mask, and
// a restored generator replaying the mask, as activation checkpointing
// needs.

#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dispatched_operators.h"
#include "fsdp/nn/dropout.h"

namespace fsdp::nn::dropout_test {
namespace {

constexpr int64_t kN = 1 << 20;

torch::Tensor inputs(int64_t n = kN) {
  torch::manual_seed(4);
  return torch::randn({n});  // no exact zeros: a zero output means dropped
}

// Five standard deviations of the fraction of n Bernoulli(q) successes.
double five_sigma(double q, int64_t n) { return 5 * std::sqrt(q * (1 - q) / static_cast<double>(n)); }

double fraction(const torch::Tensor& mask) { return mask.to(torch::kDouble).mean().item<double>(); }

TEST(Dropout, DropsWithProbabilityPAndScalesTheRestByOneOverOneMinusP) {
  const auto x = inputs();
  for (double p : {0.1, 0.5, 0.9}) {
    SCOPED_TRACE(p);
    const auto y = dropout_with_seed(x, p, 12345);
    const auto dropped = y == 0;
    EXPECT_NEAR(fraction(dropped), p, five_sigma(p, kN));
    const auto kept = dropped.logical_not();
    const auto expected = x * static_cast<float>(1.0 / (1.0 - p));
    EXPECT_TRUE(torch::equal(y.masked_select(kept), expected.masked_select(kept)));
  }
}

TEST(Dropout, NeighboursAndKeysAreIndependent) {
  const double p = 0.5;
  const auto x = inputs();
  const auto a = dropout_with_seed(x, p, 7) == 0;
  // Adjacent elements both dropped: p^2 of the pairs.
  const auto both = a.narrow(0, 0, kN - 1).logical_and(a.narrow(0, 1, kN - 1));
  EXPECT_NEAR(fraction(both), p * p, five_sigma(p * p, kN - 1));
  // Elements 2^16 apart (the split between tasks is 2^15).
  const int64_t far = 1 << 16;
  const auto far_both = a.narrow(0, 0, kN - far).logical_and(a.narrow(0, far, kN - far));
  EXPECT_NEAR(fraction(far_both), p * p, five_sigma(p * p, kN - far));
  // Keys one bit apart, in either half of the seed, and keys far apart:
  // the masks agree on p^2 + (1 - p)^2 of the elements, as independent ones do.
  for (uint64_t other : {uint64_t{6}, uint64_t{7} ^ (uint64_t{1} << 40), uint64_t{0x9e3779b97f4a7c15}}) {
    SCOPED_TRACE(other);
    const auto b = dropout_with_seed(x, p, other) == 0;
    const double agree = p * p + (1 - p) * (1 - p);
    EXPECT_NEAR(fraction(a == b), agree, five_sigma(agree, kN));
  }
}

TEST(Dropout, Bf16DropsTheSameElementsAndRoundsTheKeptOnes) {
  const double p = 0.2;
  const auto x = inputs();
  const auto y32 = dropout_with_seed(x, p, 99);
  const auto xb = x.to(torch::kBFloat16);
  const auto yb = dropout_with_seed(xb, p, 99);
  EXPECT_TRUE(torch::equal(yb == 0, y32 == 0));
  const auto kept = (yb != 0);
  const auto expected = (xb.to(torch::kFloat) * static_cast<float>(1.0 / (1.0 - p))).to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(yb.masked_select(kept), expected.masked_select(kept)));
}

TEST(Dropout, TheMaskDoesNotDependOnTheThreadCount) {
  const auto x = inputs(3 * kN + 17);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = dropout_with_seed(x, 0.3, 5);
  at::set_num_threads(std::max(2, threads));
  const auto several = dropout_with_seed(x, 0.3, 5);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, several));
}

TEST(Dropout, BackwardAppliesTheForwardsMask) {
  torch::nn::Dropout module(0.3);
  module->train();
  const auto x = inputs(4096).view({64, 64}).requires_grad_();
  const auto y = dropout(module, x);
  const auto dy = torch::randn({64, 64});
  y.backward(dy);
  const auto expected = torch::where(y.detach() == 0, torch::zeros_like(dy), dy * static_cast<float>(1.0 / 0.7));
  EXPECT_TRUE(torch::equal(x.grad(), expected));
  EXPECT_GT(fraction(y.detach() == 0), 0.2);  // the premise: a mask was applied
}

TEST(Dropout, ARestoredGeneratorReplaysTheMaskAndANewDrawChangesIt) {
  torch::nn::Dropout module(0.5);
  module->train();
  const auto x = inputs(4096);
  torch::manual_seed(11);
  const auto first = dropout(module, x);
  const auto second = dropout(module, x);
  torch::manual_seed(11);
  const auto replayed = dropout(module, x);
  EXPECT_TRUE(torch::equal(first, replayed));
  EXPECT_FALSE(torch::equal(first, second));
}

TEST(Dropout, RunsNoBernoulliAndLeavesTheInputAloneWhenOff) {
  torch::nn::Dropout module(0.1);
  module->train();
  const auto x = inputs(4096).requires_grad_();
  const auto ops = testing::dispatched_operators([&] { dropout(module, x).sum().backward(); });
  EXPECT_EQ(ops.count("aten::bernoulli_"), 0u);
  EXPECT_EQ(ops.count("aten::dropout"), 0u);
  module->eval();
  EXPECT_TRUE(dropout(module, x).is_same(x));
  torch::nn::Dropout off(0.0);
  off->train();
  EXPECT_TRUE(dropout(off, x).is_same(x));
}

TEST(Dropout, ProbabilityOneDropsEverything) {
  torch::nn::Dropout module(1.0);
  module->train();
  EXPECT_TRUE(torch::equal(dropout(module, inputs(1000)), torch::zeros({1000})));
}

}  // namespace
}  // namespace fsdp::nn::dropout_test
