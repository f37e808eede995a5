// fsdp::nn::silu_mul (SwiGLU's activation) against silu(gate) * up
// computed in double by LibTorch: values and both gradients, over the
// range an MLP sees and the tails where the sigmoid saturates.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dispatched_operators.h"
#include "fsdp/nn/layers.h"
#include "tensor_checks.h"

namespace fsdp::nn::silu_mul_test {
namespace {

using torch::Tensor;

struct Result {
  Tensor h, dg, du;
};

// Gates from -30 to 30 (the sigmoid saturated at both ends) and normal
// ones; ups and incoming gradients normal.
struct Inputs {
  Tensor g, u, dh;
};

Inputs inputs() {
  torch::manual_seed(3);
  const auto g = torch::cat({torch::linspace(-30, 30, 6001), torch::randn({4000}) * 3}).to(torch::kDouble);
  return {g, torch::randn_like(g), torch::randn_like(g)};
}

Result run(const Inputs& in, torch::ScalarType dtype, bool ours) {
  const auto leaf = [&](const Tensor& t) { return t.detach().to(dtype, false, /*copy=*/true).requires_grad_(); };
  auto g = leaf(in.g), u = leaf(in.u);
  auto h = ours ? silu_mul(g, u) : torch::silu(g) * u;
  h.backward(in.dh.to(dtype));
  return {h.detach(), g.grad(), u.grad()};
}

// Largest |a - exact| over (|exact| + floor): relative where the value is
// large, absolute near 0 (a product of rounded factors has no relative
// bound there).
double worst(const Tensor& a, const Tensor& exact, double floor) {
  return ((a.to(torch::kDouble) - exact).abs() / (exact.abs() + floor)).max().item<double>();
}

TEST(SiluMul, Fp32MatchesTheProductInDouble) {
  // Within 1e-6 of the largest value, and element by element no further
  // from exact than LibTorch's fp32 (both lose digits where the gate's
  // gradient crosses 0, at g = -1.28, to 1 + g (1 - s)'s cancellation).
  const auto in = inputs();
  const auto exact = run(in, torch::kDouble, false);
  const auto ours = run(in, torch::kFloat, true), theirs = run(in, torch::kFloat, false);
  for (const auto& [name, a, b, e] : {std::tuple{"output", ours.h, theirs.h, exact.h},
                                      std::tuple{"gate gradient", ours.dg, theirs.dg, exact.dg},
                                      std::tuple{"up gradient", ours.du, theirs.du, exact.du}}) {
    SCOPED_TRACE(name);
    EXPECT_LT((a.to(torch::kDouble) - e).abs().max().item<double>() / e.abs().max().item<double>(), 1e-6);
    EXPECT_LE(worst(a, e, 1e-3), 2 * worst(b, e, 1e-3) + 1e-6);
  }
}

TEST(SiluMul, Bf16IsAsCloseAsLibTorchsOwnBf16) {
  // One rounding each (the product computed in float) where LibTorch's
  // bf16 rounds silu(gate) and the product: within 2^-8 relative, and no
  // further from exact than LibTorch's.
  const auto in = inputs();
  const auto exact = run(in, torch::kDouble, false);
  const auto ours = run(in, torch::kBFloat16, true), theirs = run(in, torch::kBFloat16, false);
  for (const auto& [name, a, b, e] : {std::tuple{"output", ours.h, theirs.h, exact.h},
                                      std::tuple{"gate gradient", ours.dg, theirs.dg, exact.dg},
                                      std::tuple{"up gradient", ours.du, theirs.du, exact.du}}) {
    SCOPED_TRACE(name);
    // The inputs are bf16-rounded too: measured against exact values of
    // the rounded inputs, the bound is the output's own rounding.
    EXPECT_LE(worst(a, e, 1e-2), 1.5 * worst(b, e, 1e-2) + 1e-3);
  }
  const auto bf16 = [](const Tensor& t) { return t.to(torch::kBFloat16).to(torch::kDouble); };
  const auto rounded = Inputs{bf16(in.g), bf16(in.u), bf16(in.dh)};
  const auto exact_of_rounded = run(rounded, torch::kDouble, false);
  // Rounded once: half a bf16 ulp (2^-9) relative, and float's own error
  // near the gate gradient's zero (floored at 1e-4).
  EXPECT_LT(worst(ours.h, exact_of_rounded.h, 1e-4), 1.0 / 256);
  EXPECT_LT(worst(ours.du, exact_of_rounded.du, 1e-4), 1.0 / 256);
  EXPECT_LT(worst(ours.dg, exact_of_rounded.dg, 1e-4), 1.0 / 256);
}

TEST(SiluMul, SwiGLUTakesIt) {
  SwiGLU mlp(8, 16);
  const auto x = torch::randn({3, 8});
  const auto expected = mlp->down_proj(silu_mul(mlp->gate_proj(x), mlp->up_proj(x)));
  EXPECT_TRUE(torch::equal(mlp(x), expected));
  // and it is the activation it names, to fp32 rounding
  const auto composite = mlp->down_proj(torch::silu(mlp->gate_proj(x)) * mlp->up_proj(x));
  EXPECT_TRUE(torch::allclose(mlp(x), composite, 1e-5, 1e-6));
}

TEST(SiluMul, LibTorchsOperatorsNoLongerRun) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto g = torch::randn({4, 9, 32}).to(dtype).requires_grad_();
    const auto u = torch::randn({4, 9, 32}).to(dtype).requires_grad_();
    const auto ops = testing::dispatched_operators([&] { silu_mul(g, u).sum().backward(); });
    for (const char* op : {"aten::silu", "aten::silu_backward", "aten::mul", "aten::sigmoid"}) {
      EXPECT_EQ(ops.count(op), 0u) << op << " ran in " << c10::toString(dtype);
    }
    EXPECT_TRUE(g.grad().defined() && u.grad().defined());
  }
}

// Llama 4's experts: gate and up are the two halves of one matmul's
// output. 301 rows of 2 x 77: with two threads a range ends mid-row.
TEST(SiluMulHalves, MatchesTheCompositeInDouble) {
  torch::manual_seed(4);
  const auto x = torch::randn({301, 154}, torch::kDouble) * 3;
  const auto dy = torch::randn({301, 77}, torch::kDouble);
  auto ours_in = x.to(torch::kFloat).requires_grad_(), exact_in = x.clone().requires_grad_();
  const auto ours = testing::with_threads(2, [&] { return silu_mul_halves(ours_in); });
  ours.backward(dy.to(torch::kFloat));
  const auto halves = exact_in.chunk(2, -1);
  const auto exact = torch::silu(halves[0]) * halves[1];
  exact.backward(dy);
  EXPECT_LT(testing::relative_gap(ours, exact), 1e-6);
  EXPECT_LT(testing::relative_gap(ours_in.grad(), exact_in.grad()), 1e-6);
}

// bf16: the same bits as silu_mul on the two halves (tested above to round
// once), values and gradient.
TEST(SiluMulHalves, Bf16IsSiluMulOfTheHalves) {
  torch::manual_seed(5);
  const auto x = torch::randn({3, 40, 2 * 96}).to(torch::kBFloat16);
  const auto dy = torch::randn({3, 40, 96}).to(torch::kBFloat16);
  auto a = x.clone().requires_grad_(), b = x.clone().requires_grad_();
  const auto ours = silu_mul_halves(a);
  ours.backward(dy);
  const auto halves = b.chunk(2, -1);
  const auto theirs = silu_mul(halves[0], halves[1]);
  theirs.backward(dy);
  EXPECT_TRUE(torch::equal(ours, theirs));
  EXPECT_TRUE(torch::equal(a.grad(), b.grad()));
}

TEST(SiluMulHalves, NeitherHalfIsCopiedNorTheirGradientsConcatenated) {
  const auto x = torch::randn({6, 64}).requires_grad_();
  const auto dy = torch::randn({6, 32});
  const auto ops = testing::dispatched_operators([&] { silu_mul_halves(x).backward(dy); });
  for (const char* op : {"aten::chunk", "aten::split", "aten::cat", "aten::clone", "aten::silu", "aten::mul"}) {
    EXPECT_EQ(ops.count(op), 0u) << op;
  }
  EXPECT_TRUE(x.grad().defined());
}

TEST(SiluMulHalves, AnOddWidthIsRefusedAndOtherDtypesUseLibTorch) {
  testing::expect_refused([] { silu_mul_halves(torch::randn({2, 7})); }, "a last dimension of 7 (expected an even one");
  const auto x = torch::randn({2, 8}, torch::kDouble);
  const auto halves = x.chunk(2, -1);
  EXPECT_TRUE(torch::equal(silu_mul_halves(x), torch::silu(halves[0]) * halves[1]));
}

TEST(SiluMul, NonContiguousInputsAndOtherDtypesStillWork) {
  const auto both = torch::randn({4, 10}, torch::kDouble);
  const auto g = both.narrow(1, 0, 5).to(torch::kFloat), u = both.narrow(1, 5, 5).to(torch::kFloat);
  const auto gv = torch::randn({4, 10}).narrow(1, 0, 5);  // a strided view
  EXPECT_TRUE(torch::allclose(silu_mul(gv, u), torch::silu(gv) * u, 1e-6, 1e-6));
  // Double falls back to LibTorch's operators.
  const auto gd = g.to(torch::kDouble), ud = u.to(torch::kDouble);
  EXPECT_TRUE(torch::equal(silu_mul(gd, ud), torch::silu(gd) * ud));
}

}  // namespace
}  // namespace fsdp::nn::silu_mul_test
