#include "fsdp/nn/layers.h"

#include "fsdp/core/options.h"

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

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

}  // namespace fsdp::nn
