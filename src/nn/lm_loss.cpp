#include "fsdp/nn/lm_loss.h"

#include <torch/csrc/autograd/custom_function.h>

namespace fsdp::nn {
namespace {

// N = rows (B*T), C = channels, V = vocabulary
struct ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets, int64_t chunk) {
    ctx->save_for_backward({hidden, weight, targets});
    ctx->saved_data["chunk"] = chunk;
    const int64_t N = hidden.size(0);
    at::Tensor total = torch::zeros({}, torch::kDouble);
    for (int64_t start = 0; start < N; start += chunk) {
      const int64_t n = std::min(chunk, N - start);
      auto logits = hidden.narrow(0, start, n).matmul(weight.t()).to(torch::kFloat);  // (n, V)
      total += torch::nn::functional::cross_entropy(
                   logits, targets.narrow(0, start, n),
                   torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .to(torch::kDouble);
    }
    return (total / N).to(torch::kFloat);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& hidden = saved[0];
    const auto& weight = saved[1];
    const auto& targets = saved[2];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t N = hidden.size(0);
    const auto scale = grad_outputs[0].to(torch::kFloat) / N;
    auto grad_hidden = torch::empty_like(hidden);
    auto grad_weight = torch::zeros(weight.sizes(), weight.options().dtype(torch::kFloat));
    for (int64_t start = 0; start < N; start += chunk) {
      const int64_t n = std::min(chunk, N - start);
      auto h = hidden.narrow(0, start, n);
      // d(loss)/d(logits) = softmax - one_hot(target), times the mean's 1/N.
      auto g = h.matmul(weight.t()).to(torch::kFloat).softmax(-1);
      g.scatter_add_(1, targets.narrow(0, start, n).unsqueeze(1), torch::full({n, 1}, -1.0f));
      g.mul_(scale);
      grad_hidden.narrow(0, start, n).copy_(g.to(hidden.scalar_type()).matmul(weight));
      grad_weight.add_(g.t().matmul(h.to(torch::kFloat)));
    }
    return {grad_hidden, grad_weight.to(weight.scalar_type()), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor lm_loss(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets) {
  auto h = hidden.reshape({-1, hidden.size(-1)});
  auto logits = h.matmul(weight.t()).to(torch::kFloat);
  return torch::nn::functional::cross_entropy(logits, targets.reshape({-1}));
}

torch::Tensor chunked_lm_loss(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                              int64_t chunk_rows) {
  TORCH_CHECK(chunk_rows > 0, "chunk_rows must be positive");
  return ChunkedCrossEntropy::apply(hidden.reshape({-1, hidden.size(-1)}), weight, targets.reshape({-1}), chunk_rows);
}

}  // namespace fsdp::nn
