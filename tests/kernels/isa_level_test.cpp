// The element-wise kernels built at one x86-64 ISA level (FSDP_KERNEL_ISA:
// the AVX2 level or the baseline), the clones that a CPU without AVX-512
// runs, against the formulas computed in double here. The library's own
// tests (tests/nn/) run whichever clone the test machine picks.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/kernels.h"

namespace fsdp::kernels {
namespace {

bool cpu_has_level() {
  __builtin_cpu_init();
  return std::strcmp(FSDP_KERNEL_ISA, "x86-64") == 0 || __builtin_cpu_supports(FSDP_KERNEL_ISA);
}

#define SKIP_WITHOUT_LEVEL() \
  if (!cpu_has_level()) GTEST_SKIP() << "this CPU does not run " FSDP_KERNEL_ISA " code"

// -30 to 30 in steps of 0.01 (both tails saturated), then normal values.
std::vector<float> inputs() {
  std::vector<float> x;
  for (int i = -3000; i <= 3000; ++i) x.push_back(static_cast<float>(i) / 100.0f);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int i = 0; i < 4001; ++i) x.push_back(normal(rng));  // odd: a partial vector at the end
  return x;
}

std::vector<float> normals(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (auto& e : v) e = normal(rng);
  return v;
}

// The largest |got - exact| over the largest |exact|: gradients cross zero
// where their terms cancel, so an element-wise relative gap would measure
// the cancellation, not the kernel.
struct Error {
  double worst = 0, largest = 0;
  void add(float got, double exact) {
    worst = std::max(worst, std::fabs(got - exact));
    largest = std::max(largest, std::fabs(exact));
  }
  double relative() const { return worst / largest; }
};
// Four times float's unit roundoff (2^-24), of the largest value.
constexpr double kFourRoundings = 0x1p-22;

uint16_t to_bf16_bits(float f) {  // round to nearest, ties to even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16_bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = to_bf16_bits(v[i]);
  return b;
}
std::vector<float> widened(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = from_bf16_bits(b[i]);
  return v;
}

TEST(KernelsAtOneIsaLevel, GeluAndItsGradientMatchDouble) {
  SKIP_WITHOUT_LEVEL();
  const auto x = inputs();
  const auto dy = normals(x.size(), 6);
  const auto n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size()), dx(x.size());
  gelu_tanh(x.data(), y.data(), n);
  gelu_tanh_backward(x.data(), dy.data(), dx.data(), n);
  Error y_error, dx_error;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (v + 0.044715 * v * v * v));
    const double grad = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v);
    y_error.add(y[i], 0.5 * v * (1 + t));
    dx_error.add(dx[i], dy[i] * grad);
  }
  EXPECT_LT(y_error.relative(), kFourRoundings);
  EXPECT_LT(dx_error.relative(), kFourRoundings);
}

TEST(KernelsAtOneIsaLevel, SiluMulAndItsGradientsMatchDouble) {
  SKIP_WITHOUT_LEVEL();
  const auto g = inputs();
  const auto u = normals(g.size(), 7), dh = normals(g.size(), 8);
  const auto n = static_cast<int64_t>(g.size());
  std::vector<float> h(g.size()), dg(g.size()), du(g.size());
  silu_mul(g.data(), u.data(), h.data(), n);
  silu_mul_backward(g.data(), u.data(), dh.data(), dg.data(), du.data(), n);
  Error h_error, dg_error, du_error;
  for (size_t i = 0; i < g.size(); ++i) {
    const double v = g[i], s = 1 / (1 + std::exp(-v));
    h_error.add(h[i], v * s * u[i]);
    du_error.add(du[i], double(dh[i]) * v * s);
    dg_error.add(dg[i], double(dh[i]) * u[i] * s * (1 + v * (1 - s)));
  }
  EXPECT_LT(h_error.relative(), kFourRoundings);
  EXPECT_LT(du_error.relative(), kFourRoundings);
  EXPECT_LT(dg_error.relative(), kFourRoundings);
}

// bf16 is the float computation on the widened input, rounded once.
TEST(KernelsAtOneIsaLevel, Bf16IsTheFloatResultRoundedOnce) {
  SKIP_WITHOUT_LEVEL();
  const auto xb = to_bf16(inputs()), ub = to_bf16(normals(xb.size(), 9)), db = to_bf16(normals(xb.size(), 10));
  const auto x = widened(xb), u = widened(ub), d = widened(db);
  const auto n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size()), dx(x.size()), h(x.size()), dg(x.size()), du(x.size());
  gelu_tanh(x.data(), y.data(), n);
  gelu_tanh_backward(x.data(), d.data(), dx.data(), n);
  silu_mul(x.data(), u.data(), h.data(), n);
  silu_mul_backward(x.data(), u.data(), d.data(), dg.data(), du.data(), n);
  std::vector<uint16_t> yb(x.size()), dxb(x.size()), hb(x.size()), dgb(x.size()), dub(x.size());
  gelu_tanh_bf16(xb.data(), yb.data(), n);
  gelu_tanh_backward_bf16(xb.data(), db.data(), dxb.data(), n);
  silu_mul_bf16(xb.data(), ub.data(), hb.data(), n);
  silu_mul_backward_bf16(xb.data(), ub.data(), db.data(), dgb.data(), dub.data(), n);
  EXPECT_EQ(yb, to_bf16(y));
  EXPECT_EQ(dxb, to_bf16(dx));
  EXPECT_EQ(hb, to_bf16(h));
  EXPECT_EQ(dgb, to_bf16(dg));
  EXPECT_EQ(dub, to_bf16(du));
}

// Each element is dropped or scaled exactly, about p of them dropped, the
// same ones however the call is split and in either dtype.
TEST(KernelsAtOneIsaLevel, DropoutKeepsScalesAndSplitsConsistently) {
  SKIP_WITHOUT_LEVEL();
  const auto x = normals(100003, 11);
  const auto n = static_cast<int64_t>(x.size());
  const double p = 0.1;
  const float scale = static_cast<float>(1 / (1 - p));
  const uint32_t threshold = dropout_threshold(p);
  std::vector<float> y(x.size()), split(x.size());
  dropout_apply(x.data(), y.data(), n, 0, 42, threshold, scale);
  const int64_t cut = 777;
  dropout_apply(x.data(), split.data(), cut, 0, 42, threshold, scale);
  dropout_apply(x.data() + cut, split.data() + cut, n - cut, cut, 42, threshold, scale);
  EXPECT_EQ(y, split);
  int64_t dropped = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] == 0.0f) {
      ++dropped;
    } else {
      ASSERT_EQ(y[i], x[i] * scale) << "element " << i;
    }
  }
  EXPECT_NEAR(static_cast<double>(dropped) / n, p, 0.005);

  const auto xb = to_bf16(x);
  std::vector<uint16_t> yb(x.size());
  dropout_apply_bf16(xb.data(), yb.data(), n, 0, 42, threshold, scale);
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t expected = y[i] == 0.0f ? 0 : to_bf16_bits(from_bf16_bits(xb[i]) * scale);
    ASSERT_EQ(yb[i], expected) << "element " << i;
  }
}

}  // namespace
}  // namespace fsdp::kernels
