#include "fsdp/optim/fused_adamw.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include "fsdp/common/compat.h"
#include "kernels/kernels.h"

namespace fsdp::optim {
namespace {

// Elements one thread takes at a time: large enough that splitting costs
// nothing, small enough that two threads share even a small model.
constexpr int64_t kGrain = 1 << 15;

bool fusable_tensor(const at::Tensor& t, const at::Tensor& like) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && t.scalar_type() == at::kFloat &&
         t.is_contiguous() && t.numel() == like.numel();
}

}  // namespace

bool FusedAdamW::fusable() const {
  for (const auto& group : param_groups()) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return false;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!fusable_tensor(p, p) || !fusable_tensor(p.grad(), p)) return false;
      const auto it = state().find(compat::optimizer_state_key(p));
      if (it == state().end()) continue;
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      if (!fusable_tensor(s.exp_avg(), p) || !fusable_tensor(s.exp_avg_sq(), p)) return false;
    }
  }
  return true;
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  step_scaled(1.0);
  return loss;
}

torch::Tensor FusedAdamW::step_scaled(double gradient_scale) {
  last_step_fused_ = fusable();
  if (last_step_fused_) {
    fused_step(static_cast<float>(gradient_scale));
    return {};
  }
  if (device_fusable()) {
    last_step_fused_ = true;
    device_fused_step(gradient_scale);
    return {};
  }
  if (gradient_scale != 1.0) {
    torch::NoGradGuard no_grad;
    for (auto& group : param_groups()) {
      for (auto& p : group.params()) {
        if (p.grad().defined()) p.mutable_grad().mul_(gradient_scale);
      }
    }
  }
  return torch::optim::AdamW::step();
}

// The parameter's state as torch::optim::AdamW keeps it (made at its first
// step), its step counter advanced for this step.
torch::optim::AdamWParamState& FusedAdamW::stepped_state(const torch::Tensor& p) {
  auto& slot = state()[compat::optimizer_state_key(p)];
  if (!slot) {
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
    fresh->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
    slot = std::move(fresh);
  }
  auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
  s.step(s.step() + 1);
  return s;
}

bool FusedAdamW::device_fusable() const {
#if FSDP_TORCH_VERSION >= 201
  std::optional<at::Device> device;
  for (const auto& group : param_groups()) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return false;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!p.is_cuda() || !at::isFloatingType(p.scalar_type()) || p.grad().is_sparse() ||
          p.grad().device() != p.device() || p.grad().scalar_type() != p.scalar_type()) {
        return false;
      }
      if (device && *device != p.device()) return false;
      device = p.device();
    }
  }
  return device.has_value();
#else
  return false;
#endif
}

// LibTorch's fused kernel (torch.optim.AdamW(fused=True)'s): the same
// update as torch::optim::AdamW, in one launch for a group's parameters
// instead of about ten per parameter. Steps stay torch's AdamWParamState
// counters; the kernel reads each as a float tensor, as PyTorch keeps them.
void FusedAdamW::device_fused_step(double gradient_scale) {
#if FSDP_TORCH_VERSION >= 201
  torch::NoGradGuard no_grad;
  RECORD_USER_SCOPE("fsdp::fused_adamw");
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
    std::vector<float> steps;
    for (auto& p : group.params()) {
      if (!p.grad().defined() || p.numel() == 0) continue;
      auto& s = stepped_state(p);
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(s.exp_avg());
      exp_avg_sqs.push_back(s.exp_avg_sq());
      steps.push_back(static_cast<float>(s.step()));
    }
    if (params.empty()) continue;
    const auto on_device = at::TensorOptions().dtype(at::kFloat).device(params.front().device());
    // One copy for every step counter, seen as one 0-d tensor each.
    const auto step_values = at::tensor(steps, at::kFloat).to(on_device.device());
    const std::vector<at::Tensor> step_tensors = step_values.unbind(0);
    // The kernel divides each gradient by grad_scale (AMP's unscaling).
    std::optional<at::Tensor> grad_scale;
    if (gradient_scale != 1.0) grad_scale = at::full({}, 1.0 / gradient_scale, on_device);
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, step_tensors, o.lr(),
                      std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(), /*amsgrad=*/false,
                      /*maximize=*/false, grad_scale, /*found_inf=*/std::nullopt);
  }
#else
  (void)gradient_scale;
#endif
}

void FusedAdamW::fused_step(float gradient_scale) {
  torch::NoGradGuard no_grad;
  RECORD_USER_SCOPE("fsdp::fused_adamw");
  std::vector<kernels::AdamWSegment> segments;
  std::vector<int64_t> starts;  // each segment's first element in the virtual concatenation
  int64_t total = 0;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    for (auto& p : group.params()) {
      if (!p.grad().defined() || p.numel() == 0) continue;
      auto& s = stepped_state(p);
      // As torch::optim::AdamW: corrections and step size in double, then
      // each rounded to float where its tensor op would round it.
      const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(s.step()));
      const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(s.step()));
      kernels::AdamWSegment seg;
      seg.param = p.data_ptr<float>();
      seg.grad = p.grad().data_ptr<float>();
      seg.exp_avg = s.exp_avg().data_ptr<float>();
      seg.exp_avg_sq = s.exp_avg_sq().data_ptr<float>();
      seg.numel = p.numel();
      seg.decay = static_cast<float>(o.weight_decay() != 0 ? 1 - o.lr() * o.weight_decay() : 1.0);
      seg.beta1 = static_cast<float>(beta1);
      seg.one_minus_beta1 = static_cast<float>(1 - beta1);
      seg.beta2 = static_cast<float>(beta2);
      seg.one_minus_beta2 = static_cast<float>(1 - beta2);
      seg.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
      seg.eps = static_cast<float>(o.eps());
      seg.neg_step_size = static_cast<float>(-(o.lr() / bias_correction1));
      seg.grad_scale = gradient_scale;
      segments.push_back(seg);
      starts.push_back(total);
      total += seg.numel;
    }
  }
  // One parallel pass over all segments as if they were one flat buffer:
  // a thread's range may start inside one parameter and end in another.
  at::parallel_for(0, total, kGrain, [&](int64_t begin, int64_t end) {
    auto i = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() - 1);
    for (; begin < end; ++i) {
      const int64_t stop = std::min(end, starts[i] + segments[i].numel);
      kernels::adamw_update(segments[i], begin - starts[i], stop - starts[i]);
      begin = stop;
    }
  });
}

}  // namespace fsdp::optim
