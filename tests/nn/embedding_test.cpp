// An Embedding that shares its weight with the output head
// (share_with_output_head): its gradient is the same dense gradient plain
// lookups give, without a dense (vocab, C) matrix from the lookup.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "fsdp/nn/layers.h"
#include "fsdp/nn/lm_loss.h"
#include "dispatched_operators.h"

namespace fsdp::nn::embedding_test {
namespace {

using torch::Tensor;

struct TiedWeights {
  Embedding shared{50, 8};
  Tensor ids = torch::randint(0, 50, {3, 7});
  Tensor reference_weight;
  TiedWeights() {
    torch::manual_seed(4);
    shared->share_with_output_head();
    reference_weight = shared->weight.detach().clone().requires_grad_();
  }
};

// The loss as a model computes it: lookups, then the head over the same weight.
Tensor tied_loss(const Tensor& hidden, const Tensor& weight, const Tensor& ids) {
  return lm_loss(hidden * 1.5, weight, ids.remainder(50));
}

TEST(SharedEmbedding, GradientIsDenseAndEqualsPlainLookupsWithTheHead) {
  TiedWeights s;
  tied_loss(s.shared(s.ids), s.shared->weight, s.ids).backward();
  tied_loss(torch::embedding(s.reference_weight, s.ids), s.reference_weight, s.ids).backward();
  const auto& grad = s.shared->weight.grad();
  ASSERT_TRUE(grad.defined());
  EXPECT_FALSE(grad.is_sparse());
  EXPECT_TRUE(torch::allclose(grad, s.reference_weight.grad(), 1e-6, 1e-7));
}

TEST(SharedEmbedding, WithoutTheHeadTheGradientIsStillDense) {
  TiedWeights s;
  s.shared(s.ids).pow(2).sum().backward();
  torch::embedding(s.reference_weight, s.ids).pow(2).sum().backward();
  const auto& grad = s.shared->weight.grad();
  ASSERT_TRUE(grad.defined());
  EXPECT_FALSE(grad.is_sparse());
  EXPECT_TRUE(torch::allclose(grad, s.reference_weight.grad(), 1e-6, 1e-7));
}

TEST(SharedEmbedding, NoDenseLookupGradientIsBuilt) {
  TiedWeights s;
  const auto seen =
      testing::dispatched_operators([&] { tied_loss(s.shared(s.ids), s.shared->weight, s.ids).backward(); });
  EXPECT_EQ(seen.count("aten::embedding_dense_backward"), 0u);
  EXPECT_EQ(seen.count("aten::embedding_sparse_backward"), 1u) << "the counter sees the lookup's backward";
}

}  // namespace
}  // namespace fsdp::nn::embedding_test
