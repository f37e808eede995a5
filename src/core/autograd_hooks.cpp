#include "core/autograd_hooks.h"

#include <memory>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

namespace fsdp {

namespace {

// Held by the end-of-backward callback alone: destroyed unrun when the
// graph task dies without running its callbacks.
struct EndOfBackward {
  std::function<void()> abandon;
  bool completed = false;
  explicit EndOfBackward(std::function<void()> a) : abandon(std::move(a)) {}
  EndOfBackward(const EndOfBackward&) = delete;
  EndOfBackward& operator=(const EndOfBackward&) = delete;
  ~EndOfBackward() {
    if (!completed && abandon) abandon();
  }
};

class BeforeAccumulate : public torch::autograd::FunctionPreHook {
 public:
  explicit BeforeAccumulate(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    fn_();
    return grads;
  }

 private:
  std::function<void()> fn_;
};

class AfterAccumulate : public torch::autograd::FunctionPostHook {
 public:
  explicit AfterAccumulate(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

void queue_end_of_backward(std::function<void()> end, std::function<void()> abandon) {
  auto guard = std::make_shared<EndOfBackward>(std::move(abandon));
  torch::autograd::Engine::get_default_engine().queue_callback([guard, end = std::move(end)] {
    end();
    guard->completed = true;
  });
}

void hook_grad_accumulator(const at::Tensor& param, compat::AutogradNodePtr& held, std::function<void()> before,
                           std::function<void()> after) {
  auto accumulator = torch::autograd::impl::grad_accumulator(param);
  if (accumulator == nullptr || accumulator == held) return;
  if (before) accumulator->add_pre_hook(std::make_unique<BeforeAccumulate>(std::move(before)));
  if (after) accumulator->add_post_hook(std::make_unique<AfterAccumulate>(std::move(after)));
  held = std::move(accumulator);
}

at::Tensor flat_alias(const at::Tensor& flat, int64_t offset, at::IntArrayRef shape) {
  return at::empty({0}, flat.options()).set_(flat.storage(), flat.storage_offset() + offset, shape,
                                             c10::contiguous_strides(shape));
}

at::Tensor cast_forward_input(const at::Tensor& input, const MixedPrecisionPolicy& policy) {
  if (!policy.param_dtype || !policy.cast_forward_inputs || !input.defined() ||
      !at::isFloatingType(input.scalar_type()) || input.scalar_type() == *policy.param_dtype) {
    return input;
  }
  return input.to(*policy.param_dtype);
}

}  // namespace fsdp
