#include "fsdp/nn/activation_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

#include "fsdp/nn/packed_rows.h"

namespace fsdp::nn {
namespace {

at::Generator device_generator(const at::Device& device) { return at::globalContext().defaultGenerator(device); }

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                                                const CheckpointedMultiFn* fn) {
    ctx->saved_data["rng"] = at::detail::getDefaultCPUGenerator().get_state();
    // Dropout on a GPU draws from that device's generator.
    if (input.is_cuda()) ctx->saved_data["rng_device"] = device_generator(input.device()).get_state();
    ctx->saved_data["fn"] = reinterpret_cast<int64_t>(fn);
    // Packed rows in force now are the recomputation's too (packed_rows.h).
    if (const PackedRows* rows = PackedRowsScope::current()) {
      ctx->saved_data["packed_positions"] = rows->positions;
      ctx->saved_data["packed_starts"] = rows->starts;
    }
    ctx->save_for_backward({input});
    torch::NoGradGuard no_grad;
    return (*fn)(input);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto* fn = reinterpret_cast<const CheckpointedMultiFn*>(ctx->saved_data["fn"].toInt());
    torch::Tensor input = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    // Replay with the forward's random state, then put the current one back.
    auto generator = at::detail::getDefaultCPUGenerator();
    const auto current = generator.get_state();
    generator.set_state(ctx->saved_data["rng"].toTensor());
    const bool on_device = ctx->saved_data.count("rng_device") > 0;
    at::Generator device_gen;
    at::Tensor device_current;
    if (on_device) {
      device_gen = device_generator(input.device());
      device_current = device_gen.get_state();
      device_gen.set_state(ctx->saved_data["rng_device"].toTensor());
    }
    std::vector<torch::Tensor> outputs;
    {
      torch::AutoGradMode enable(true);
      std::optional<PackedRows> rows;
      std::optional<PackedRowsScope> scope;
      if (ctx->saved_data.count("packed_starts") > 0) {
        rows = PackedRows{ctx->saved_data["packed_positions"].toTensor(), ctx->saved_data["packed_starts"].toTensor()};
        scope.emplace(*rows);
      }
      outputs = (*fn)(input);
    }
    generator.set_state(current);
    if (on_device) device_gen.set_state(device_current);
    std::vector<torch::Tensor> with_grad, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (grad_outputs[i].defined() && outputs[i].requires_grad()) {
        with_grad.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!with_grad.empty()) torch::autograd::backward(with_grad, grads);
    return {input.grad(), torch::Tensor()};
  }
};

}  // namespace

std::vector<torch::Tensor> checkpoint(const CheckpointedMultiFn& fn, const torch::Tensor& input_in) {
  if (!torch::GradMode::is_enabled()) return fn(input_in);
  // An input without a gradient (the first block's, when the embedding is
  // frozen, as under LoRA) would leave the outputs outside the graph, and
  // the parameters inside (the adapters) without gradients: it takes part
  // as one that has, as Hugging Face's enable_input_require_grads makes it.
  const torch::Tensor input = input_in.requires_grad() ? input_in : input_in.detach().requires_grad_(true);
  // The function object must outlive backward: keep a copy in a shared
  // holder captured by the graph through the saved data.
  auto holder = std::make_shared<CheckpointedMultiFn>(fn);
  auto outputs = CheckpointFunction::apply(input, holder.get());
  // Tie the holder's lifetime to the outputs' autograd node.
  if (!outputs.empty() && outputs[0].grad_fn()) {
    struct Keep : torch::autograd::FunctionPreHook {
      explicit Keep(std::shared_ptr<CheckpointedMultiFn> f) : fn(std::move(f)) {}
      torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override { return grads; }
      std::shared_ptr<CheckpointedMultiFn> fn;
    };
    outputs[0].grad_fn()->add_pre_hook(std::make_unique<Keep>(holder));
  }
  return outputs;
}

torch::Tensor checkpoint(const CheckpointedFn& fn, const torch::Tensor& input) {
  return checkpoint(CheckpointedMultiFn([fn](const torch::Tensor& x) { return std::vector<torch::Tensor>{fn(x)}; }),
                    input)[0];
}

std::tuple<torch::Tensor, torch::Tensor> maybe_checkpoint(bool enabled, const CheckpointedMultiFn& fn,
                                                          const torch::Tensor& input) {
  const auto out = enabled ? checkpoint(fn, input) : fn(input);
  return {out[0], out.size() > 1 ? out[1] : torch::Tensor()};
}

}  // namespace fsdp::nn
