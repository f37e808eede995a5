#include "fsdp/nn/layers.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include "fsdp/core/options.h"
#include "kernels/kernels.h"

namespace fsdp::nn {
namespace {
thread_local bool t_deferred = false;
}

DeferredInit::DeferredInit() : previous_(t_deferred) { t_deferred = true; }
DeferredInit::~DeferredInit() { t_deferred = previous_; }
bool DeferredInit::active() { return t_deferred; }

torch::Tensor new_parameter(torch::IntArrayRef shape, const std::function<void(torch::Tensor&)>& init) {
  if (t_deferred) return deferred_empty(shape);
  torch::Tensor t = torch::empty(shape);
  torch::NoGradGuard no_grad;
  init(t);
  return t;
}

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias, double std) {
  weight = register_parameter("weight", new_parameter({out, in}, [std](torch::Tensor& t) { t.normal_(0, std); }));
  if (with_bias) bias = register_parameter("bias", new_parameter({out}, [](torch::Tensor& t) { t.zero_(); }));
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight, bias); }

EmbeddingImpl::EmbeddingImpl(int64_t count, int64_t dim, double std) {
  weight = register_parameter("weight", new_parameter({count, dim}, [std](torch::Tensor& t) { t.normal_(0, std); }));
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) { return torch::embedding(weight, ids); }

LayerNormImpl::LayerNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", new_parameter({dim}, [](torch::Tensor& t) { t.fill_(1); }));
  bias = register_parameter("bias", new_parameter({dim}, [](torch::Tensor& t) { t.zero_(); }));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  return torch::layer_norm(x, {weight.size(0)}, weight, bias, eps);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", new_parameter({dim}, [](torch::Tensor& t) { t.fill_(1); }));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  auto x32 = x.to(torch::kFloat);
  auto normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

SwiGLUImpl::SwiGLUImpl(int64_t dim, int64_t hidden, double std) {
  gate_proj = register_module("gate_proj", Linear(dim, hidden, /*bias=*/false, std));
  up_proj = register_module("up_proj", Linear(dim, hidden, /*bias=*/false, std));
  down_proj = register_module("down_proj", Linear(hidden, dim, /*bias=*/false, std));
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) { return down_proj(torch::silu(gate_proj(x)) * up_proj(x)); }

namespace {

constexpr int64_t kGeluGrain = 1 << 15;

uint16_t* bf16_bits(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

struct GeluTanh : public torch::autograd::Function<GeluTanh> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input) {
    RECORD_USER_SCOPE("fsdp::gelu_tanh");
    const auto x = input.contiguous();
    auto y = torch::empty_like(x);
    at::parallel_for(0, x.numel(), kGeluGrain, [&](int64_t begin, int64_t end) {
      if (x.scalar_type() == at::kBFloat16) {
        kernels::gelu_tanh_bf16(bf16_bits(x) + begin, bf16_bits(y) + begin, end - begin);
      } else {
        kernels::gelu_tanh(x.data_ptr<float>() + begin, y.data_ptr<float>() + begin, end - begin);
      }
    });
    ctx->save_for_backward({x});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    RECORD_USER_SCOPE("fsdp::gelu_tanh_backward");
    const auto x = ctx->get_saved_variables()[0];
    const auto dy = grad_outputs[0].to(x.scalar_type()).contiguous();
    auto dx = torch::empty_like(x);
    at::parallel_for(0, x.numel(), kGeluGrain, [&](int64_t begin, int64_t end) {
      if (x.scalar_type() == at::kBFloat16) {
        kernels::gelu_tanh_backward_bf16(bf16_bits(x) + begin, bf16_bits(dy) + begin, bf16_bits(dx) + begin,
                                         end - begin);
      } else {
        kernels::gelu_tanh_backward(x.data_ptr<float>() + begin, dy.data_ptr<float>() + begin,
                                    dx.data_ptr<float>() + begin, end - begin);
      }
    });
    return {dx};
  }
};

}  // namespace

torch::Tensor gelu_tanh(const torch::Tensor& x) {
  const bool ours = x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16);
  return ours ? GeluTanh::apply(x) : torch::gelu(x, "tanh");
}

}  // namespace fsdp::nn
