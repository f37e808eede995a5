// fsdp::nn::rms_norm_rows (and RMSNorm, which uses it on the CPU) against
// RMS norm computed in double by LibTorch: values and the gradients of
// input and weight; in bf16, against the module's formula in LibTorch's
// bf16.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dispatched_operators.h"
#include "fsdp/nn/layers.h"
#include "tensor_checks.h"

namespace fsdp::nn::rms_norm_test {
namespace {

using testing::relative_gap;
using torch::Tensor;

struct Result {
  Tensor y, dx, dw;
};

// A (3, 37, width) input (111 rows: several row blocks and a partial one),
// a weight away from 1, and an incoming gradient.
struct Inputs {
  Tensor x, w, dy;
};

Inputs inputs(int64_t width) {
  torch::manual_seed(9);
  return {torch::randn({3, 37, width}, torch::kDouble) * 3 + 0.5, torch::randn({width}, torch::kDouble) * 0.5 + 1,
          torch::randn({3, 37, width}, torch::kDouble)};
}

// Hugging Face's formula as LibTorch's operators: normalised in fp32,
// rounded to the input's dtype, times the weight.
Tensor formula(const Tensor& x, const Tensor& w, double eps) {
  const auto x32 = x.to(torch::kFloat);
  const auto normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return w * normed.to(x.scalar_type());
}

Result run(const Inputs& in, torch::ScalarType dtype, bool ours) {
  const auto leaf = [&](const Tensor& t) { return t.detach().to(dtype, false, /*copy=*/true).requires_grad_(); };
  auto x = leaf(in.x), w = leaf(in.w);
  Tensor y;
  if (ours) {
    y = rms_norm_rows(x, w, 1e-6);
  } else if (dtype == torch::kDouble) {
    y = w * x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + 1e-6);
  } else {
    y = formula(x, w, 1e-6);
  }
  y.backward(in.dy.to(dtype));
  return {y.detach(), x.grad(), w.grad()};
}

void expect_close(const Result& a, const Result& exact, double tol) {
  EXPECT_LT(relative_gap(a.y, exact.y), tol) << "output";
  EXPECT_LT(relative_gap(a.dx, exact.dx), tol) << "input gradient";
  EXPECT_LT(relative_gap(a.dw, exact.dw), tol) << "weight gradient";
}

TEST(RMSNormRows, Fp32MatchesRMSNormInDouble) {
  for (int64_t width : {7, 128, 768, 1000}) {
    SCOPED_TRACE(width);
    const auto in = inputs(width);
    expect_close(run(in, torch::kFloat, true), run(in, torch::kDouble, false), 1e-5);
  }
}

TEST(RMSNormRows, OneColumnIsAsCloseAsTheFormulasFp32) {
  // One column: y = w x / sqrt(x^2 + eps), whose input gradient is of
  // eps's order, what is left of 1 - xhat^2. fp32 keeps no digits of it
  // either way; ours stays as close as the formula's.
  const auto in = inputs(1);
  const auto exact = run(in, torch::kDouble, false);
  const auto ours = run(in, torch::kFloat, true), theirs = run(in, torch::kFloat, false);
  EXPECT_LT(relative_gap(ours.y, exact.y), 1e-5);
  EXPECT_LT(relative_gap(ours.dw, exact.dw), 1e-5);
  const auto abs_err = [&](const Tensor& a) { return (a.to(torch::kDouble) - exact.dx).abs().max().item<double>(); };
  EXPECT_LE(abs_err(ours.dx), 2 * abs_err(theirs.dx) + 1e-9);
}

TEST(RMSNormRows, Bf16IsAsCloseAsLibTorchsOwnBf16) {
  // bf16 rounds input, weight, output and gradients (2^-8 relative each):
  // within 2e-2 of exact, and no further from it than the formula's bf16.
  const auto in = inputs(768);
  const auto exact = run(in, torch::kDouble, false);
  const auto ours = run(in, torch::kBFloat16, true), theirs = run(in, torch::kBFloat16, false);
  expect_close(ours, exact, 2e-2);
  EXPECT_LE(relative_gap(ours.y, exact.y), 1.5 * relative_gap(theirs.y, exact.y) + 1e-3);
  EXPECT_LE(relative_gap(ours.dx, exact.dx), 1.5 * relative_gap(theirs.dx, exact.dx) + 1e-3);
  EXPECT_LE(relative_gap(ours.dw, exact.dw), 1.5 * relative_gap(theirs.dw, exact.dw) + 1e-3);
}

TEST(RMSNormRows, Bf16OutputRoundsAsTheFormulaDoes) {
  // Normalised rows rounded to bf16 before the weight and after it: the
  // forward equals the formula's bf16 but for the sum of squares' order.
  const auto in = inputs(768);
  const auto x = in.x.to(torch::kBFloat16), w = in.w.to(torch::kBFloat16);
  const auto ours = rms_norm_rows(x, w, 1e-6).to(torch::kDouble), theirs = formula(x, w, 1e-6).to(torch::kDouble);
  const double differing = (ours != theirs).to(torch::kDouble).mean().item<double>();
  EXPECT_LT(differing, 0.01) << "share of outputs that differ from the formula's bf16";
  EXPECT_LT(relative_gap(ours, theirs), 1e-2);
}

TEST(RMSNormRows, RMSNormTakesItOnTheCpu) {
  RMSNorm norm(16, 1e-6);
  torch::NoGradGuard no_grad;
  norm->weight.normal_(1, 0.3);
  auto x = torch::randn({5, 16});
  EXPECT_TRUE(torch::equal(norm(x), rms_norm_rows(x, norm->weight, 1e-6)));
  norm->to(torch::kBFloat16);
  const auto xb = x.to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(norm(xb), rms_norm_rows(xb, norm->weight, 1e-6)));
}

TEST(RMSNormRows, TheFormulasOperatorsNoLongerRun) {
  RMSNorm norm(64, 1e-6);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    norm->to(dtype);
    const auto x = torch::randn({4, 9, 64}).to(dtype).requires_grad_();
    const auto ops = testing::dispatched_operators([&] { norm(x).sum().backward(); });
    for (const char* op : {"aten::pow", "aten::mean", "aten::rsqrt", "aten::mul"}) {
      EXPECT_EQ(ops.count(op), 0u) << op << " ran in " << c10::toString(dtype);
    }
    EXPECT_TRUE(x.grad().defined() && norm->weight.grad().defined());
  }
}

TEST(RMSNormRows, TheResultDoesNotDependOnTheThreadCount) {
  const auto in = inputs(384);
  const auto one = testing::with_threads(1, [&] { return run(in, torch::kFloat, true); });
  const auto many = testing::with_threads(2, [&] { return run(in, torch::kFloat, true); });
  EXPECT_TRUE(torch::equal(one.y, many.y));
  EXPECT_TRUE(torch::equal(one.dx, many.dx));
  EXPECT_TRUE(torch::equal(one.dw, many.dw));
}

TEST(RMSNormRows, WeightsOfAnotherWidthOrDtypeAreRefused) {
  auto x = torch::randn({2, 8});
  testing::expect_refused([&] { rms_norm_rows(x, torch::ones({6}), 1e-6); }, "input of width 8 for a weight of 6");
  testing::expect_refused([&] { rms_norm_rows(x, torch::ones({1, 8}), 1e-6); }, "expected a 1-D weight");
  testing::expect_refused([&] { rms_norm_rows(x.to(torch::kBFloat16), torch::ones({8}), 1e-6); },
                 "expected both fp32 or both bf16, on the CPU");
  testing::expect_refused([&] { rms_norm_rows(x.to(torch::kDouble), torch::ones({8}, torch::kDouble), 1e-6); },
                 "expected both fp32 or both bf16, on the CPU");
}

TEST(RMSNormRows, AStridedInputGivesTheContiguousOnesResult) {
  const auto in = inputs(64);
  const auto wide = torch::randn({3, 37, 128});
  auto strided = wide.narrow(2, 32, 64).detach().requires_grad_();
  auto contiguous = strided.detach().contiguous().requires_grad_();
  const auto w = in.w.to(torch::kFloat);
  const auto a = rms_norm_rows(strided, w, 1e-6), b = rms_norm_rows(contiguous, w, 1e-6);
  EXPECT_TRUE(torch::equal(a, b));
  a.backward(in.dy.to(torch::kFloat));
  b.backward(in.dy.to(torch::kFloat));
  EXPECT_TRUE(torch::equal(strided.grad(), contiguous.grad()));
}

}  // namespace
}  // namespace fsdp::nn::rms_norm_test
