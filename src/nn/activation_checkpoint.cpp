#include "fsdp/nn/activation_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/custom_function.h>

namespace fsdp::nn {
namespace {

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const CheckpointedFn* fn) {
    ctx->saved_data["rng"] = at::detail::getDefaultCPUGenerator().get_state();
    ctx->saved_data["fn"] = reinterpret_cast<int64_t>(fn);
    ctx->save_for_backward({input});
    torch::NoGradGuard no_grad;
    return (*fn)(input);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto* fn = reinterpret_cast<const CheckpointedFn*>(ctx->saved_data["fn"].toInt());
    torch::Tensor input = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    // Replay with the forward's random state, then put the current one back.
    auto generator = at::detail::getDefaultCPUGenerator();
    const auto current = generator.get_state();
    generator.set_state(ctx->saved_data["rng"].toTensor());
    torch::Tensor output;
    {
      torch::AutoGradMode enable(true);
      output = (*fn)(input);
    }
    generator.set_state(current);
    torch::autograd::backward({output}, {grad_outputs[0]});
    return {input.grad(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor checkpoint(const CheckpointedFn& fn, const torch::Tensor& input) {
  if (!torch::GradMode::is_enabled()) return fn(input);
  // The function object must outlive backward: keep a copy in a shared
  // holder captured by the graph through the saved data.
  auto holder = std::make_shared<CheckpointedFn>(fn);
  torch::Tensor out = CheckpointFunction::apply(input, holder.get());
  // Tie the holder's lifetime to the output's autograd node.
  if (out.grad_fn()) {
    struct Keep : torch::autograd::FunctionPreHook {
      explicit Keep(std::shared_ptr<CheckpointedFn> f) : fn(std::move(f)) {}
      torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override { return grads; }
      std::shared_ptr<CheckpointedFn> fn;
    };
    out.grad_fn()->add_pre_hook(std::make_unique<Keep>(holder));
  }
  return out;
}

}  // namespace fsdp::nn
