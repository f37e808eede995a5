#include "fsdp/nn/layers.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "fsdp/common/compat.h"
#include "fsdp/common/deferred_tensor.h"
#include "fsdp/common/error.h"
#include "fsdp/nn/dropout.h"
#include "fsdp/nn/lora.h"
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

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  if (parallel) return parallel->forward(*this, x);
  torch::Tensor y = torch::nn::functional::linear(x, weight, bias);
  if (!lora_A || adapters_off()) return y;
  const torch::Tensor h = lora_dropout ? dropout(lora_dropout, x) : x;
  return y + lora_B->forward(lora_A->forward(h)) * lora_scale;  // PEFT's order of operations
}

EmbeddingImpl::EmbeddingImpl(int64_t count, int64_t dim, double std, std::optional<int64_t> padding_row_)
    : padding_row(padding_row_) {
  FSDP_CHECK(!padding_row || (*padding_row >= 0 && *padding_row < count), "embedding: padding row ",
             padding_row.value_or(0), " is outside the ", count, " rows");
  weight = register_parameter("weight", new_parameter({count, dim}, [std, padding_row_](torch::Tensor& t) {
                                t.normal_(0, std);
                                if (padding_row_) t[*padding_row_].zero_();
                              }));
}

namespace {

// Runs after the weight's AccumulateGrad: a sparse gradient stored there
// (the lookup's alone, without the head's) becomes dense.
class DenseGradientHook : public torch::autograd::FunctionPostHook {
 public:
  explicit DenseGradientHook(torch::Tensor weight) : weight_(std::move(weight)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    torch::Tensor& grad = weight_.mutable_grad();
    if (grad.defined() && grad.is_sparse()) grad = grad.to_dense();
    return outputs;
  }

 private:
  torch::Tensor weight_;
};

}  // namespace

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) {
  const bool sparse = sparse_backward_ && weight.requires_grad() && torch::GradMode::is_enabled();
  if (sparse) watch_gradient();
  return torch::embedding(weight, ids, padding_row.value_or(-1), /*scale_grad_by_freq=*/false, sparse);
}

void EmbeddingImpl::share_with_output_head() { sparse_backward_ = true; }

void EmbeddingImpl::watch_gradient() {
  auto accumulator = torch::autograd::impl::grad_accumulator(weight);
  if (accumulator == grad_accumulator_) return;
  accumulator->add_post_hook(std::make_unique<DenseGradientHook>(weight));
  grad_accumulator_ = std::move(accumulator);
}

LayerNormImpl::LayerNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", new_parameter({dim}, [](torch::Tensor& t) { t.fill_(1); }));
  bias = register_parameter("bias", new_parameter({dim}, [](torch::Tensor& t) { t.zero_(); }));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  // LibTorch 1.13's CPU layer norm in bf16 is a scalar loop, 8x its fp32
  // time; ours is one vectorised pass per row in float.
  const bool ours = x.device().is_cpu() && x.scalar_type() == at::kBFloat16 &&
                    weight.scalar_type() == at::kBFloat16 && bias.scalar_type() == at::kBFloat16;
  if (ours) return layer_norm_rows(x, weight, bias, eps);
  return torch::layer_norm(x, {weight.size(0)}, weight, bias, eps);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", new_parameter({dim}, [](torch::Tensor& t) { t.fill_(1); }));
}

namespace {

// What the CPU kernels take: both on the CPU, the same dtype, fp32 or bf16.
bool cpu_fp32_or_bf16(const torch::Tensor& a, const torch::Tensor& b) {
  return a.device().is_cpu() && b.device().is_cpu() && a.scalar_type() == b.scalar_type() &&
         (a.scalar_type() == at::kFloat || a.scalar_type() == at::kBFloat16);
}

}  // namespace

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
#if FSDP_TORCH_VERSION >= 204
  // On a GPU, LibTorch's rms_norm: one fused kernel each way (fp32
  // accumulation) where the formula below runs eight over the activations.
  // It rounds once after the weight where Hugging Face rounds before it too.
  if (x.is_cuda() && weight.scalar_type() == x.scalar_type()) return at::rms_norm(x, {weight.size(0)}, weight, eps);
#endif
  if (cpu_fp32_or_bf16(x, weight)) return rms_norm_rows(x, weight, eps);
  auto x32 = x.to(torch::kFloat);
  auto normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

SwiGLUImpl::SwiGLUImpl(int64_t dim, int64_t hidden, double std) {
  gate_proj = register_module("gate_proj", Linear(dim, hidden, /*bias=*/false, std));
  up_proj = register_module("up_proj", Linear(dim, hidden, /*bias=*/false, std));
  down_proj = register_module("down_proj", Linear(hidden, dim, /*bias=*/false, std));
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) { return down_proj(silu_mul(gate_proj(x), up_proj(x))); }

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

// The norms' rows: forward in ranges of at least kNormRowBlock rows, each
// range with `scratch` floats of its own.
constexpr int64_t kNormRowBlock = 32;

template <typename Row>
void for_each_row(int64_t rows, int64_t scratch, const Row& row) {
  at::parallel_for(0, rows, kNormRowBlock, [&](int64_t begin, int64_t end) {
    std::vector<float> room(scratch);
    for (int64_t r = begin; r < end; ++r) row(r, room.data());
  });
}

// Backward: `row(r, sums, scratch)` adds row r's share of the weight's
// (and bias') gradient into `sums`, `width` floats per block of
// kNormRowBlock rows. Each block's sum is one thread's, and the blocks are
// reduced as one tensor of fixed shape, so the result does not depend on
// the thread count. Returns the (width) sum.
template <typename Row>
torch::Tensor for_each_row_summing(int64_t rows, int64_t width, int64_t scratch, const Row& row) {
  const int64_t blocks = (rows + kNormRowBlock - 1) / kNormRowBlock;
  auto partial = torch::zeros({blocks, width}, torch::TensorOptions().dtype(at::kFloat));
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> room(scratch);
    for (int64_t block = begin; block < end; ++block) {
      float* sums = partial.data_ptr<float>() + block * width;
      const int64_t stop = std::min(rows, (block + 1) * kNormRowBlock);
      for (int64_t r = block * kNormRowBlock; r < stop; ++r) row(r, sums, room.data());
    }
  });
  return partial.sum(0);
}

struct LayerNormRows : public torch::autograd::Function<LayerNormRows> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight, const torch::Tensor& bias, double eps) {
    RECORD_USER_SCOPE("fsdp::layer_norm");
    const int64_t n = weight.numel();
    const auto x = input.contiguous();
    const int64_t rows = x.numel() / n;
    auto y = torch::empty_like(x);
    auto stats = torch::empty({2, rows}, x.options().dtype(at::kFloat));  // mean, rstd
    const auto w = weight.to(at::kFloat).contiguous(), b = bias.to(at::kFloat).contiguous();
    const bool bf16 = x.scalar_type() == at::kBFloat16;
    float* mean = stats.data_ptr<float>();
    float* rstd = mean + rows;
    for_each_row(rows, bf16 ? n : 0, [&](int64_t r, float* scratch) {
      if (bf16) {
        kernels::layer_norm_row_bf16(bf16_bits(x) + r * n, w.data_ptr<float>(), b.data_ptr<float>(),
                                     bf16_bits(y) + r * n, scratch, n, static_cast<float>(eps), mean + r, rstd + r);
      } else {
        kernels::layer_norm_row(x.data_ptr<float>() + r * n, w.data_ptr<float>(), b.data_ptr<float>(),
                                y.data_ptr<float>() + r * n, n, static_cast<float>(eps), mean + r, rstd + r);
      }
    });
    ctx->save_for_backward({x, w, stats});
    ctx->saved_data["dtype"] = static_cast<int64_t>(weight.scalar_type());
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    RECORD_USER_SCOPE("fsdp::layer_norm_backward");
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &stats = saved[2];
    const auto dy = grad_outputs[0].to(x.scalar_type()).contiguous();
    const int64_t n = w.numel(), rows = x.numel() / n;
    auto dx = torch::empty_like(x);
    const bool bf16 = x.scalar_type() == at::kBFloat16;
    const float* mean = stats.data_ptr<float>();
    const float* rstd = mean + rows;
    // Per block: dw's n sums, then db's.
    const auto sums = for_each_row_summing(rows, 2 * n, bf16 ? 3 * n : 0, [&](int64_t r, float* dw, float* scratch) {
      if (bf16) {
        kernels::layer_norm_backward_row_bf16(bf16_bits(x) + r * n, bf16_bits(dy) + r * n, w.data_ptr<float>(),
                                              mean[r], rstd[r], bf16_bits(dx) + r * n, dw, dw + n, scratch, n);
      } else {
        kernels::layer_norm_backward_row(x.data_ptr<float>() + r * n, dy.data_ptr<float>() + r * n,
                                         w.data_ptr<float>(), mean[r], rstd[r], dx.data_ptr<float>() + r * n, dw,
                                         dw + n, n);
      }
    }).view({2, n});
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {dx, sums[0].to(dtype), sums[1].to(dtype), torch::Tensor()};
  }
};

struct RMSNormRows : public torch::autograd::Function<RMSNormRows> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight, double eps) {
    RECORD_USER_SCOPE("fsdp::rms_norm");
    const int64_t n = weight.numel();
    const auto x = input.contiguous();
    const int64_t rows = x.numel() / n;
    auto y = torch::empty_like(x);
    auto rstd = torch::empty({rows}, x.options().dtype(at::kFloat));
    const auto w = weight.to(at::kFloat).contiguous();
    const bool bf16 = x.scalar_type() == at::kBFloat16;
    for_each_row(rows, bf16 ? n : 0, [&](int64_t r, float* scratch) {
      if (bf16) {
        kernels::rms_norm_row_bf16(bf16_bits(x) + r * n, w.data_ptr<float>(), bf16_bits(y) + r * n, scratch, n,
                                   static_cast<float>(eps), rstd.data_ptr<float>() + r);
      } else {
        kernels::rms_norm_row(x.data_ptr<float>() + r * n, w.data_ptr<float>(), y.data_ptr<float>() + r * n, n,
                              static_cast<float>(eps), rstd.data_ptr<float>() + r);
      }
    });
    ctx->save_for_backward({x, w, rstd});
    ctx->saved_data["dtype"] = static_cast<int64_t>(weight.scalar_type());
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    RECORD_USER_SCOPE("fsdp::rms_norm_backward");
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &rstd = saved[2];
    const auto dy = grad_outputs[0].to(x.scalar_type()).contiguous();
    const int64_t n = w.numel(), rows = x.numel() / n;
    auto dx = torch::empty_like(x);
    const bool bf16 = x.scalar_type() == at::kBFloat16;
    const float* row_rstd = rstd.data_ptr<float>();
    const auto dw = for_each_row_summing(rows, n, (bf16 ? 4 : 1) * n, [&](int64_t r, float* sums, float* scratch) {
      if (bf16) {
        kernels::rms_norm_backward_row_bf16(bf16_bits(x) + r * n, bf16_bits(dy) + r * n, w.data_ptr<float>(),
                                            row_rstd[r], bf16_bits(dx) + r * n, sums, scratch, n);
      } else {
        kernels::rms_norm_backward_row(x.data_ptr<float>() + r * n, dy.data_ptr<float>() + r * n,
                                       w.data_ptr<float>(), row_rstd[r], dx.data_ptr<float>() + r * n, sums, scratch,
                                       n);
      }
    });
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {dx, dw.to(dtype), torch::Tensor()};
  }
};

constexpr int64_t kSiluMulGrain = 1 << 14;

// One run of n elements of SwiGLU's activation, each operand a tensor and
// an element offset into it: gate and up may be two tensors or the two
// halves of one row.
void silu_mul_run(const at::Tensor& g, int64_t g_at, const at::Tensor& u, int64_t u_at, const at::Tensor& h,
                  int64_t h_at, int64_t n) {
  if (g.scalar_type() == at::kBFloat16) {
    kernels::silu_mul_bf16(bf16_bits(g) + g_at, bf16_bits(u) + u_at, bf16_bits(h) + h_at, n);
  } else {
    kernels::silu_mul(g.data_ptr<float>() + g_at, u.data_ptr<float>() + u_at, h.data_ptr<float>() + h_at, n);
  }
}

// Its backward over the same runs: dh at h_at, the gradients where gate and up are.
void silu_mul_backward_run(const at::Tensor& g, const at::Tensor& dg, int64_t g_at, const at::Tensor& u,
                           const at::Tensor& du, int64_t u_at, const at::Tensor& dh, int64_t h_at, int64_t n) {
  if (g.scalar_type() == at::kBFloat16) {
    kernels::silu_mul_backward_bf16(bf16_bits(g) + g_at, bf16_bits(u) + u_at, bf16_bits(dh) + h_at,
                                    bf16_bits(dg) + g_at, bf16_bits(du) + u_at, n);
  } else {
    kernels::silu_mul_backward(g.data_ptr<float>() + g_at, u.data_ptr<float>() + u_at, dh.data_ptr<float>() + h_at,
                               dg.data_ptr<float>() + g_at, du.data_ptr<float>() + u_at, n);
  }
}

struct SiluMul : public torch::autograd::Function<SiluMul> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gate,
                               const torch::Tensor& up) {
    RECORD_USER_SCOPE("fsdp::silu_mul");
    const auto g = gate.contiguous(), u = up.contiguous();
    auto h = torch::empty_like(g);
    at::parallel_for(0, g.numel(), kSiluMulGrain,
                     [&](int64_t begin, int64_t end) { silu_mul_run(g, begin, u, begin, h, begin, end - begin); });
    ctx->save_for_backward({g, u});
    return h;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    RECORD_USER_SCOPE("fsdp::silu_mul_backward");
    const auto saved = ctx->get_saved_variables();
    const auto &g = saved[0], &u = saved[1];
    const auto dh = grad_outputs[0].to(g.scalar_type()).contiguous();
    auto dg = torch::empty_like(g), du = torch::empty_like(u);
    at::parallel_for(0, g.numel(), kSiluMulGrain, [&](int64_t begin, int64_t end) {
      silu_mul_backward_run(g, dg, begin, u, du, begin, dh, begin, end - begin);
    });
    return {dg, du};
  }
};

// Gate and up as the two halves of each row of one (rows, 2h) tensor. A
// range of the output's elements [begin, end) is cut at row ends, so the
// kernels see runs contiguous in every operand.
template <typename Run>
void for_each_run(int64_t begin, int64_t end, int64_t h, const Run& run) {
  while (begin < end) {
    const int64_t row = begin / h, col = begin % h, stop = std::min(end, (row + 1) * h);
    run(row * 2 * h + col, begin, stop - begin);  // offset of the gate's run, of the output's, length
    begin = stop;
  }
}

struct SiluMulHalves : public torch::autograd::Function<SiluMulHalves> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input) {
    RECORD_USER_SCOPE("fsdp::silu_mul");
    const auto x = input.contiguous();
    const int64_t h = x.size(-1) / 2;
    auto sizes = x.sizes().vec();
    sizes.back() = h;
    auto out = torch::empty(sizes, x.options());
    at::parallel_for(0, out.numel(), kSiluMulGrain, [&](int64_t begin, int64_t end) {
      for_each_run(begin, end, h, [&](int64_t in, int64_t o, int64_t n) { silu_mul_run(x, in, x, in + h, out, o, n); });
    });
    ctx->save_for_backward({x});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    RECORD_USER_SCOPE("fsdp::silu_mul_backward");
    const auto x = ctx->get_saved_variables()[0];
    const auto dh = grad_outputs[0].to(x.scalar_type()).contiguous();
    const int64_t h = x.size(-1) / 2;
    auto dx = torch::empty_like(x);
    at::parallel_for(0, dh.numel(), kSiluMulGrain, [&](int64_t begin, int64_t end) {
      for_each_run(begin, end, h, [&](int64_t in, int64_t o, int64_t n) {
        silu_mul_backward_run(x, dx, in, x, dx, in + h, dh, o, n);
      });
    });
    return {dx};
  }
};

}  // namespace

torch::Tensor rms_norm_rows(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  FSDP_CHECK(weight.dim() == 1 && x.size(-1) == weight.numel(), "rms_norm: input of width ", x.size(-1),
             " for a weight of ", weight.numel(), " (expected a 1-D weight of the input's width)");
  FSDP_CHECK(cpu_fp32_or_bf16(x, weight), "rms_norm: input and weight are ", x.scalar_type(), " on ", x.device(),
             " and ", weight.scalar_type(), " on ", weight.device(), "; expected both fp32 or both bf16, on the CPU");
  return RMSNormRows::apply(x, weight, eps);
}

torch::Tensor silu_mul(const torch::Tensor& gate, const torch::Tensor& up) {
  const bool ours = cpu_fp32_or_bf16(gate, up) && gate.sizes() == up.sizes();
  return ours ? SiluMul::apply(gate, up) : torch::silu(gate) * up;
}

torch::Tensor silu_mul_halves(const torch::Tensor& gate_and_up) {
  FSDP_CHECK(gate_and_up.dim() >= 1 && gate_and_up.size(-1) % 2 == 0, "silu_mul_halves: a last dimension of ",
             gate_and_up.dim() >= 1 ? gate_and_up.size(-1) : 0, " (expected an even one: gate, then up)");
  if (cpu_fp32_or_bf16(gate_and_up, gate_and_up)) return SiluMulHalves::apply(gate_and_up);
  const auto halves = gate_and_up.chunk(2, -1);
  return torch::silu(halves[0]) * halves[1];
}

torch::Tensor layer_norm_rows(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                              double eps) {
  FSDP_CHECK(x.size(-1) == weight.numel() && bias.numel() == weight.numel(), "layer_norm: input of width ",
             x.size(-1), " for a weight of ", weight.numel(), " and a bias of ", bias.numel());
  return LayerNormRows::apply(x, weight, bias, eps);
}

torch::Tensor gelu_tanh(const torch::Tensor& x) {
  return cpu_fp32_or_bf16(x, x) ? GeluTanh::apply(x) : torch::gelu(x, "tanh");
}

}  // namespace fsdp::nn
