// Times the element-wise kernels built at one x86-64 ISA level (the binary's
// name says which; tests/CMakeLists.txt builds one per level), so a machine
// with AVX-512 can also measure the AVX2 and baseline code that other CPUs
// run. Prints nanoseconds per element, the best of 30 passes over 2^20.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "kernels/kernels.h"

namespace {

using namespace fsdp::kernels;

double best_ns_per_element(int64_t n, const std::function<void()>& pass) {
  double best = 1e30;
  for (int rep = 0; rep < 30; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    pass();
    const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count() / static_cast<double>(n));
  }
  return best;
}

}  // namespace

int main() {
  const int64_t n = 1 << 20;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> a(n), b(n), c(n), d(n), e(n);
  for (int64_t i = 0; i < n; ++i) a[i] = normal(rng), b[i] = normal(rng), c[i] = normal(rng);
  std::vector<uint16_t> ab(n), bb(n), cb(n), db(n), eb(n);
  const auto bf16 = [](float f) { return static_cast<uint16_t>(__builtin_bit_cast(uint32_t, f) >> 16); };
  for (int64_t i = 0; i < n; ++i) ab[i] = bf16(a[i]), bb[i] = bf16(b[i]), cb[i] = bf16(c[i]);

  const auto row = [&](const char* kernel, const char* dtype, const std::function<void()>& pass) {
    std::printf("%-22s %-5s %.3f\n", kernel, dtype, best_ns_per_element(n, pass));
  };
  std::printf("level %s; ns per element\n", FSDP_KERNEL_ISA);
  row("gelu_tanh", "fp32", [&] { gelu_tanh(a.data(), d.data(), n); });
  row("gelu_tanh backward", "fp32", [&] { gelu_tanh_backward(a.data(), b.data(), d.data(), n); });
  row("gelu_tanh", "bf16", [&] { gelu_tanh_bf16(ab.data(), db.data(), n); });
  row("gelu_tanh backward", "bf16", [&] { gelu_tanh_backward_bf16(ab.data(), bb.data(), db.data(), n); });
  row("silu_mul", "fp32", [&] { silu_mul(a.data(), b.data(), d.data(), n); });
  row("silu_mul backward", "fp32", [&] { silu_mul_backward(a.data(), b.data(), c.data(), d.data(), e.data(), n); });
  row("silu_mul", "bf16", [&] { silu_mul_bf16(ab.data(), bb.data(), db.data(), n); });
  row("silu_mul backward", "bf16",
      [&] { silu_mul_backward_bf16(ab.data(), bb.data(), cb.data(), db.data(), eb.data(), n); });
  row("dropout", "fp32", [&] { dropout_apply(a.data(), d.data(), n, 0, 7, dropout_threshold(0.1), 1.1f); });
  row("dropout", "bf16", [&] { dropout_apply_bf16(ab.data(), db.data(), n, 0, 7, dropout_threshold(0.1), 1.1f); });
  return 0;
}
