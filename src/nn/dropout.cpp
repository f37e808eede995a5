#include "fsdp/nn/dropout.h"

#include <cmath>
#include <limits>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include "fsdp/common/error.h"
#include "kernels/kernels.h"

namespace fsdp::nn {
namespace {

// Elements per task: large enough that a task's hashing outweighs its
// scheduling, and a fixed split, though the result does not depend on it.
constexpr int64_t kGrain = 1 << 15;

bool takes(const torch::Tensor& x) {
  return x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
         x.numel() <= static_cast<int64_t>(std::numeric_limits<uint32_t>::max());
}

// out = x with the call's mask applied; x contiguous.
void apply_mask(const torch::Tensor& x, const torch::Tensor& out, double p, uint64_t seed) {
  const uint32_t threshold = kernels::dropout_threshold(p);
  const auto scale = static_cast<float>(1.0 / (1.0 - p));
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
    const auto first = static_cast<uint32_t>(begin);
    if (bf16) {
      const auto* in = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()) + begin;
      auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()) + begin;
      kernels::dropout_apply_bf16(in, o, end - begin, first, seed, threshold, scale);
    } else {
      kernels::dropout_apply(x.data_ptr<float>() + begin, out.data_ptr<float>() + begin, end - begin, first, seed,
                             threshold, scale);
    }
  });
}

struct CounterDropout : public torch::autograd::Function<CounterDropout> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input, double p) {
    RECORD_USER_SCOPE("fsdp::dropout");
    const uint64_t seed = dropout_key();
    ctx->saved_data["p"] = p;
    ctx->saved_data["seed"] = static_cast<int64_t>(seed);
    const auto x = input.contiguous();
    auto y = torch::empty_like(x);
    apply_mask(x, y, p, seed);
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    RECORD_USER_SCOPE("fsdp::dropout_backward");
    const double p = ctx->saved_data["p"].toDouble();
    const auto seed = static_cast<uint64_t>(ctx->saved_data["seed"].toInt());
    const auto dy = grad_outputs[0].contiguous();
    auto dx = torch::empty_like(dy);
    apply_mask(dy, dx, p, seed);
    return {dx, torch::Tensor()};
  }
};

}  // namespace

uint64_t dropout_key() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get<at::CPUGeneratorImpl>()->random64();
}

torch::Tensor dropout(torch::nn::Dropout& module, const torch::Tensor& x) {
  const double p = module->options.p();
  if (!module->is_training() || p == 0) return x;
  // p = 1 drops everything (and 1/(1-p) is not finite): the module's own.
  if (p >= 1 || !takes(x)) return module(x);
  return CounterDropout::apply(x, p);
}

torch::Tensor dropout_with_seed(const torch::Tensor& x, double p, uint64_t seed) {
  FSDP_CHECK(takes(x) && p >= 0 && p < 1, "dropout_with_seed: expected a CPU fp32 or bf16 tensor and 0 <= p < 1, got ",
             x.device(), " ", x.scalar_type(), " and p = ", p);
  const auto in = x.contiguous();
  auto out = torch::empty_like(in);
  apply_mask(in, out, p, seed);
  return out;
}

}  // namespace fsdp::nn
