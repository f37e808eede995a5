#pragma once
// The layers the model families are built from (Linear, Embedding,
// LayerNorm), with LibTorch's parameter names (weight, bias) and math, plus
// one thing LibTorch's own layers cannot do: deferred construction. Inside a
// DeferredInit scope their parameters are created with fsdp::deferred_empty
// (full shape, no memory), so a model larger than one rank's memory can be
// built and then materialised shard by shard by fully_shard's param_init.

#include <optional>

#include <torch/torch.h>

#include "fsdp/common/compat.h"

namespace fsdp::nn {

// While alive, new_parameter() creates deferred parameters (this thread).
class DeferredInit {
 public:
  DeferredInit();
  ~DeferredInit();
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;
  static bool active();

 private:
  bool previous_;
};

// A parameter of `shape` initialised by `init` (skipped when deferred).
torch::Tensor new_parameter(torch::IntArrayRef shape, const std::function<void(torch::Tensor&)>& init);

struct LinearImpl;
// A forward other than the plain one, for a layer cut across ranks
// (tensor_parallel/linear_styles.h): the layer's weight and bias are then
// this rank's part, and the style adds the collectives.
struct LinearForward {
  virtual ~LinearForward() = default;
  virtual torch::Tensor forward(LinearImpl& layer, const torch::Tensor& x) = 0;
};

// y = x W^T + b, W (out, in); initialised N(0, std). With LoRA adapters
// (nn/lora.h's add_lora), y + lora_scale * lora_B(lora_A(dropout(x))).
struct LinearImpl : torch::nn::Module {
  LinearImpl(int64_t in, int64_t out, bool bias, double std = 0.02);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
  std::shared_ptr<LinearImpl> lora_A, lora_B;  // null without LoRA
  torch::nn::Dropout lora_dropout{nullptr};
  double lora_scale = 0;
  std::shared_ptr<LinearForward> parallel;  // null: the plain forward
};
TORCH_MODULE(Linear);

// (vocab, C), initialised N(0, std). With a padding row (transformers'
// `padding_idx`, from config.json's pad_token_id), that row starts at zero
// in a fresh model and the lookup gives it no gradient, as nn.Embedding's
// does; a head tied to the embedding still trains it.
struct EmbeddingImpl : torch::nn::Module {
  EmbeddingImpl(int64_t count, int64_t dim, double std = 0.02, std::optional<int64_t> padding_row = std::nullopt);
  torch::Tensor forward(const torch::Tensor& ids);
  // For a weight the output head shares: the lookup's gradient leaves
  // backward as the rows it touches (sparse), which autograd adds in place
  // into the head's dense gradient, instead of a zero-filled (vocab, C)
  // matrix added out of place. A sparse gradient that arrives alone (the
  // head unused) is made dense once stored, so the parameter's gradient is
  // always dense.
  void share_with_output_head();
  torch::Tensor weight;
  std::optional<int64_t> padding_row;  // in [0, count)

 private:
  void watch_gradient();

  bool sparse_backward_ = false;
  // The weight's AccumulateGrad node, kept alive with the hook that makes
  // its gradient dense; replaced when autograd replaces the node (set_data
  // to another dtype, as FSDP's mixed precision does).
  compat::AutogradNodePtr grad_accumulator_;
};
TORCH_MODULE(Embedding);

// GELU with the tanh approximation (GPT-2's "gelu_new"), LibTorch's
// gelu(x, "tanh") in one vectorised pass each way on CPU in fp32 and bf16
// (ATen's bf16 form converts element by element); elsewhere, LibTorch's.
torch::Tensor gelu_tanh(const torch::Tensor& x);

// Layer norm over the last dimension, one vectorised pass per row each
// way with the statistics in float, for CPU tensors in fp32 or bf16 (x,
// weight and bias of one dtype). LayerNorm uses it for bf16, where
// LibTorch 1.13's CPU kernel is a scalar loop; fp32 stays LibTorch's.
torch::Tensor layer_norm_rows(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                              double eps);

// RMS norm over the last dimension, y = weight * (x * rsqrt(mean(x^2) +
// eps)), one vectorised pass per row each way with the statistics in
// float, for CPU tensors in fp32 or bf16 (x and weight of one dtype; bf16
// rounded before the weight and after it, as Hugging Face rounds).
// RMSNorm uses it on the CPU where the formula takes eight passes. Other
// devices, dtypes or a weight of another width are refused. As with the
// other fused layers here, gradients are first order only.
torch::Tensor rms_norm_rows(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// SwiGLU's activation, silu(gate) * up, in one vectorised pass each way on
// CPU in fp32 and bf16 (computed in float, rounded once; nothing kept but
// the two inputs; first-order gradients only); elsewhere, LibTorch's two
// operators.
torch::Tensor silu_mul(const torch::Tensor& gate, const torch::Tensor& up);
// The same on one projection's output holding both, gate in the first half
// of the last dimension and up in the second (Llama 4's experts): read in
// place, and the gradient written as one tensor of the input's shape, where
// chunk() then silu_mul would copy each half and concatenate their
// gradients.
torch::Tensor silu_mul_halves(const torch::Tensor& gate_and_up);

struct LayerNormImpl : torch::nn::Module {
  LayerNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
  double eps;
};
TORCH_MODULE(LayerNorm);

// x * rsqrt(mean(x^2) + eps) * weight over the last dimension, computed in
// fp32 whatever the input dtype (as Hugging Face does).
struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;  // (dim)
  double eps;
};
TORCH_MODULE(RMSNorm);

// down_proj(silu(gate_proj(x)) * up_proj(x)), no biases: Llama's and
// Qwen3's MLP, and each Mixture-of-Experts expert.
struct SwiGLUImpl : torch::nn::Module {
  SwiGLUImpl(int64_t dim, int64_t hidden, double std = 0.02);
  torch::Tensor forward(const torch::Tensor& x);
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(SwiGLU);

}  // namespace fsdp::nn
