// fsdp::nn::gelu_tanh against the same function computed in double by
// LibTorch: values and gradients over the range a transformer's MLP sees
// and beyond.

#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fsdp/nn/layers.h"

namespace fsdp::nn::gelu_test {
namespace {

struct ValueAndGrad {
  torch::Tensor y, dx;
};

ValueAndGrad run(const torch::Tensor& input, const torch::Tensor& dy, bool ours) {
  auto x = input.detach().clone().requires_grad_();
  auto y = ours ? gelu_tanh(x) : torch::gelu(x, "tanh");
  y.backward(dy);
  return {y.detach(), x.grad()};
}

// The reference, in double: 0.5 x (1 + tanh(u)) written as x sigmoid(2u),
// which keeps its digits in the negative tail (double's 1 + tanh(u) is 0
// there, and so is gelu(x, "tanh") in double), differentiated by autograd.
ValueAndGrad exact(const torch::Tensor& input, const torch::Tensor& dy) {
  auto x = input.to(torch::kDouble).requires_grad_();
  const double k = std::sqrt(2.0 / M_PI);
  auto y = x * torch::sigmoid(2 * k * (x + 0.044715 * x.pow(3)));
  y.backward(dy.to(torch::kDouble));
  return {y.detach(), x.grad()};
}

// Inputs from -12 to 12 (tanh saturated at both ends), plus normal ones;
// a random incoming gradient.
torch::Tensor inputs(torch::ScalarType dtype) {
  torch::manual_seed(2);
  return torch::cat({torch::linspace(-12, 12, 4801), torch::randn({3, 1000}).flatten() * 2}).to(dtype);
}

// |a - exact| in units of `ulp` (a dtype's spacing relative to the value)
// at the exact value's magnitude, floored at 1e-30: the far tail, where
// e^-87 and below are flushed to 0, counts as zero.
double worst_ulps(const torch::Tensor& a, const torch::Tensor& exact, double ulp) {
  const auto scale = exact.abs().clamp_min(1e-30) * ulp;
  return ((a.to(torch::kDouble) - exact).abs() / scale).max().item<double>();
}

double worst_gap(const torch::Tensor& a, const torch::Tensor& exact) {
  return (a.to(torch::kDouble) - exact).abs().max().item<double>();
}

// fp32 cannot do better than the function's conditioning: u's rounding
// (1e-7 of u) becomes a relative error of u * 1e-7 in e^-2|u| in the
// negative tail, and the gradient's two terms cancel where it crosses zero.
// So: the largest absolute errors of values and gradients within twice
// LibTorch's own fp32 gelu's (both are rounding-level), and every value
// within 16 ulps of the exact one where x is in [-4, 4], the MLP's range
// (at x = -4, 2|u| = 6.8 turns u's half ulp into about 7 ulps of e^-2|u|).
TEST(GeluTanh, Fp32IsAsAccurateAsLibTorchsOwnAgainstTheExactFunction) {
  const auto x = inputs(torch::kFloat);
  const auto dy = torch::randn(x.sizes());
  const auto ours = run(x, dy, true), libtorch = run(x, dy, false);
  const auto reference = exact(x, dy);
  EXPECT_EQ(ours.y.scalar_type(), torch::kFloat);
  EXPECT_LE(worst_gap(ours.y, reference.y), 2 * worst_gap(libtorch.y, reference.y));
  EXPECT_LE(worst_gap(ours.dx, reference.dx), 2 * worst_gap(libtorch.dx, reference.dx));
  RecordProperty("worst_gap_1e-9_value_gradient_ours", std::to_string(1e9 * worst_gap(ours.y, reference.y)) + " " +
                                                           std::to_string(1e9 * worst_gap(ours.dx, reference.dx)));
  RecordProperty("worst_gap_1e-9_value_gradient_libtorch",
                 std::to_string(1e9 * worst_gap(libtorch.y, reference.y)) + " " +
                     std::to_string(1e9 * worst_gap(libtorch.dx, reference.dx)));
  const auto core = x.abs() <= 4;
  EXPECT_LE(worst_ulps(ours.y.masked_select(core), reference.y.masked_select(core), 1.19e-7), 16);
  EXPECT_EQ(gelu_tanh(torch::zeros({1})).item<float>(), 0.0f) << "gelu(0) is exactly 0";
}

TEST(GeluTanh, Bf16IsTheExactValueRoundedOnce) {
  const auto x = inputs(torch::kBFloat16);
  const auto dy = torch::randn(x.sizes()).to(torch::kBFloat16);
  const auto ours = run(x, dy, true);
  EXPECT_EQ(ours.y.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(ours.dx.scalar_type(), torch::kBFloat16);
  const auto reference = exact(x, dy);
  // Rounding once leaves half a bf16 ulp (2^-8 relative, at most); the
  // float computation's own error can move a value across a rounding
  // boundary: one ulp at most.
  const double bf16_ulp = 1.0 / 128;
  EXPECT_LE(worst_ulps(ours.y, reference.y, bf16_ulp), 1.0) << "value";
  EXPECT_LE(worst_ulps(ours.dx, reference.dx, bf16_ulp), 1.0) << "gradient";
}

}  // namespace
}  // namespace fsdp::nn::gelu_test
