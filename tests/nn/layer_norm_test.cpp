// fsdp::nn::layer_norm_rows (and LayerNorm, which uses it for bf16)
// against layer norm computed in double by LibTorch: values and the
// gradients of input, weight and bias.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fsdp/nn/layers.h"
#include "tensor_checks.h"

namespace fsdp::nn::layer_norm_test {
namespace {

using testing::relative_gap;
using torch::Tensor;

struct Result {
  Tensor y, dx, dw, db;
};

// A (3, 37, width) input (111 rows: several row blocks and a partial one),
// a weight and bias away from 1 and 0, and an incoming gradient.
struct Inputs {
  Tensor x, w, b, dy;
};

Inputs inputs(int64_t width) {
  torch::manual_seed(8);
  return {torch::randn({3, 37, width}, torch::kDouble) * 3 + 0.5, torch::randn({width}, torch::kDouble) * 0.5 + 1,
          torch::randn({width}, torch::kDouble) * 0.1, torch::randn({3, 37, width}, torch::kDouble)};
}

Result run(const Inputs& in, torch::ScalarType dtype, bool ours) {
  const auto leaf = [&](const Tensor& t) { return t.detach().to(dtype, false, /*copy=*/true).requires_grad_(); };
  auto x = leaf(in.x), w = leaf(in.w), b = leaf(in.b);
  auto y = ours ? layer_norm_rows(x, w, b, 1e-5) : torch::layer_norm(x, {w.size(0)}, w, b, 1e-5);
  y.backward(in.dy.to(dtype));
  return {y.detach(), x.grad(), w.grad(), b.grad()};
}

void expect_close(const Result& a, const Result& exact, double tol) {
  EXPECT_LT(relative_gap(a.y, exact.y), tol) << "output";
  EXPECT_LT(relative_gap(a.dx, exact.dx), tol) << "input gradient";
  EXPECT_LT(relative_gap(a.dw, exact.dw), tol) << "weight gradient";
  EXPECT_LT(relative_gap(a.db, exact.db), tol) << "bias gradient";
}

TEST(LayerNormRows, Fp32MatchesLayerNormInDouble) {
  for (int64_t width : {1, 7, 384, 1000}) {
    const auto in = inputs(width);
    expect_close(run(in, torch::kFloat, true), run(in, torch::kDouble, false), 1e-5);
  }
}

TEST(LayerNormRows, Bf16IsAsCloseAsLibTorchsOwnBf16) {
  // bf16 rounds input, weight, output and gradients (2^-8 relative each):
  // within 2e-2 of exact, and no further from it than LibTorch's bf16.
  const auto in = inputs(384);
  const auto exact = run(in, torch::kDouble, false);
  const auto ours = run(in, torch::kBFloat16, true), theirs = run(in, torch::kBFloat16, false);
  expect_close(ours, exact, 2e-2);
  EXPECT_LE(relative_gap(ours.y, exact.y), 1.5 * relative_gap(theirs.y, exact.y) + 1e-3);
  EXPECT_LE(relative_gap(ours.dx, exact.dx), 1.5 * relative_gap(theirs.dx, exact.dx) + 1e-3);
}

TEST(LayerNormRows, LayerNormTakesItForBf16) {
  LayerNorm norm(16, 1e-5);
  auto x = torch::randn({5, 16});
  norm->to(torch::kBFloat16);
  const auto xb = x.to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(norm(xb), layer_norm_rows(xb, norm->weight, norm->bias, 1e-5)));
}

TEST(LayerNormRows, TheResultDoesNotDependOnTheThreadCount) {
  const auto in = inputs(384);
  const auto one = testing::with_threads(1, [&] { return run(in, torch::kFloat, true); });
  const auto many = testing::with_threads(2, [&] { return run(in, torch::kFloat, true); });
  EXPECT_TRUE(torch::equal(one.y, many.y));
  EXPECT_TRUE(torch::equal(one.dx, many.dx));
  EXPECT_TRUE(torch::equal(one.dw, many.dw));
  EXPECT_TRUE(torch::equal(one.db, many.db));
}

TEST(LayerNormRows, AWeightOfTheWrongWidthIsRefused) {
  testing::expect_refused([] { layer_norm_rows(torch::randn({2, 8}), torch::ones({6}), torch::zeros({6}), 1e-5); },
                          "input of width 8 for a weight of 6");
}

}  // namespace
}  // namespace fsdp::nn::layer_norm_test
