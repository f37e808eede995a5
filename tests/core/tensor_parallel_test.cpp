// Tensor parallelism's linear styles (tensor_parallel/linear_styles.h) at
// the test world's size: an MLP cut column-wise then row-wise computes what
// the whole MLP computes in one process, and its gradients are the whole
// MLP's, cut the same way.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <numeric>
#include <string>

#include "../distributed/dist_test_world.h"
#include "fsdp/common/error.h"
#include "fsdp/models/llama/tensor_parallel.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/layers.h"
#include "fsdp/nn/lm_loss.h"
#include "fsdp/tensor_parallel/linear_styles.h"

namespace fsdp::testing::tensor_parallel_test {
namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    // 60 wide: it divides by every world size the suite runs (1 to 5).
    up = register_module("up", nn::Linear(8, 60, true, 0.3));
    down = register_module("down", nn::Linear(60, 8, true, 0.3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return down(torch::gelu(up(x))); }
  nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(Mlp);

Mlp seeded_mlp() {
  torch::manual_seed(11);
  Mlp mlp;
  torch::NoGradGuard no_grad;
  mlp->down->bias.normal_(0, 0.3);
  mlp->up->bias.normal_(0, 0.3);
  return mlp;
}

std::shared_ptr<dist::ProcessGroup> whole_world_group(const std::string& name) {
  std::vector<int> ranks(static_cast<size_t>(test_world().size()));
  std::iota(ranks.begin(), ranks.end(), 0);
  return test_world().new_group(name, ranks);
}

TEST(TensorParallel, ColumnThenRowWiseMlpEqualsTheWholeMlpForwardAndBackward) {
  const auto group = whole_world_group("tp-mlp");
  const int ranks = group->size(), rank = group->rank();
  auto whole = seeded_mlp(), cut = seeded_mlp();
  tp::parallelize_linear(*cut->up, tp::LinearStyle::kColumnwise, group);
  tp::parallelize_linear(*cut->down, tp::LinearStyle::kRowwise, group);
  EXPECT_EQ(cut->up->weight.sizes(), (std::vector<int64_t>{60 / ranks, 8}));
  EXPECT_EQ(cut->down->weight.sizes(), (std::vector<int64_t>{8, 60 / ranks}));

  // The same input on every rank, as a TP group sees it.
  torch::manual_seed(3);
  const auto x = torch::randn({5, 8});
  const auto x_whole = x.clone().requires_grad_(), x_cut = x.clone().requires_grad_();
  const auto y_whole = whole->forward(x_whole), y_cut = cut->forward(x_cut);
  // Sums over the ranks' parts add in another order than the whole
  // layer's: equal to fp32 rounding, relative to the largest value.
  const auto near = [](const torch::Tensor& ours, const torch::Tensor& expected) {
    return (ours - expected).abs().max().item<double>() / expected.abs().max().item<double>();
  };
  EXPECT_LT(near(y_cut, y_whole), 1e-5);
  (y_whole * y_whole).sum().backward();
  (y_cut * y_cut).sum().backward();
  EXPECT_LT(near(x_cut.grad(), x_whole.grad()), 1e-5) << "the input's gradient";
  const int64_t part = 60 / ranks;
  EXPECT_LT(near(cut->up->weight.grad(), whole->up->weight.grad().narrow(0, rank * part, part)), 1e-5);
  EXPECT_LT(near(cut->up->bias.grad(), whole->up->bias.grad().narrow(0, rank * part, part)), 1e-5);
  EXPECT_LT(near(cut->down->weight.grad(), whole->down->weight.grad().narrow(1, rank * part, part)), 1e-5);
  EXPECT_LT(near(cut->down->bias.grad(), whole->down->bias.grad()), 1e-5) << "the bias, whole";
}

// llama-tiny (4 query heads, 2 key/value heads, an MLP 176 wide) cut by
// Llama's plan: the loss and every gradient are the whole model's, the
// cut projections' gradients cut alike.
TEST(TensorParallel, LlamaCutByItsPlanEqualsTheWholeModel) {
  const auto group = whole_world_group("tp-llama");
  const int ranks = group->size(), rank = group->rank();
  const auto build = [] {
    torch::manual_seed(21);
    auto model = models::build_preset("llama-tiny");
    return std::dynamic_pointer_cast<models::LlamaForCausalLMImpl>(model);
  };
  auto whole = build(), cut = build();
  ASSERT_TRUE(whole && cut);
  if (2 % ranks != 0) {
    // Fewer key/value heads than ranks: refused by name, not replicated.
    try {
      models::tensor_parallelize_llama(*cut, group);
      ADD_FAILURE() << "2 key/value heads were cut over " << ranks << " ranks";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("2 key/value heads"), std::string::npos) << e.what();
    }
    return;
  }
  models::tensor_parallelize_llama(*cut, group);
  torch::manual_seed(5);
  const auto tokens = torch::randint(0, 512, {2, 17});
  const auto inputs = tokens.narrow(1, 0, 16), targets = tokens.narrow(1, 1, 16);
  const auto loss_of = [&](models::LlamaForCausalLMImpl& m) {
    return nn::lm_loss(m.forward(inputs), m.output_weight(), targets);
  };
  const auto loss_whole = loss_of(*whole), loss_cut = loss_of(*cut);
  EXPECT_NEAR(loss_cut.item<double>(), loss_whole.item<double>(), 1e-5);
  loss_whole.backward();
  loss_cut.backward();
  const auto whole_params = whole->named_parameters();
  int64_t cut_params = 0;
  for (const auto& item : cut->named_parameters()) {
    const auto& grad = item.value().grad();
    const auto& expected_whole = whole_params[item.key()].grad();
    ASSERT_TRUE(grad.defined()) << item.key();
    torch::Tensor expected = expected_whole;
    for (int64_t dim = 0; dim < grad.dim(); ++dim) {
      if (grad.size(dim) == expected_whole.size(dim)) continue;
      const int64_t part = grad.size(dim);
      expected = expected.narrow(dim, rank * part, part);
      ++cut_params;
    }
    EXPECT_TRUE(torch::allclose(grad, expected, 1e-4, 1e-6)) << item.key() << ": " << (grad - expected).abs().max();
  }
  EXPECT_EQ(cut_params, ranks == 1 ? 0 : 2 * 7) << "q, k, v, o, gate, up and down of each of 2 layers";
}

TEST(TensorParallel, ASizeThatDoesNotDivideIsRefusedNamingIt) {
  const auto group = whole_world_group("tp-odd");
  if (group->size() == 1) GTEST_SKIP() << "every size divides by one rank";
  nn::Linear odd(8, 2 * group->size() + 1, false);
  try {
    tp::parallelize_linear(*odd, tp::LinearStyle::kColumnwise, group);
    ADD_FAILURE() << "an output size that does not divide was cut";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs its output size " + std::to_string(2 * group->size() + 1)),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fsdp::testing::tensor_parallel_test
