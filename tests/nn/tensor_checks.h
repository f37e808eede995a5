#pragma once
// Checks the layer tests share: how far a result is from an exact one, a
// call run at one thread count, and a refusal's message.

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <string>

namespace fsdp::testing {

// The largest |a - exact| relative to exact's largest magnitude (floored at
// 1e-6: where everything is 0 up to double's rounding, as a one-column
// norm's output, the absolute error).
inline double relative_gap(const torch::Tensor& a, const torch::Tensor& exact) {
  return (a.to(torch::kDouble) - exact).abs().max().item<double>() /
         std::max(exact.abs().max().item<double>(), 1e-6);
}

// `run()` with LibTorch's intra-op pool at `threads`, restored after.
template <typename Run>
auto with_threads(int threads, const Run& run) {
  const int before = at::get_num_threads();
  at::set_num_threads(threads);
  auto result = run();
  at::set_num_threads(before);
  return result;
}

// `call` throws, and its message contains `message`.
inline void expect_refused(const std::function<void()>& call, const std::string& message) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected: " << message;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

}  // namespace fsdp::testing
