#include "fsdp/optim/fused_adamw.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_set>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include "fsdp/common/compat.h"
#include "fsdp/common/error.h"
#include "fsdp/common/host_buffer.h"
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

void FusedAdamW::set_state_offload(bool offload, bool pin_memory) {
  offload_state_ = offload;
  pin_memory_ = pin_memory;
}

torch::Tensor FusedAdamW::step_scaled(double gradient_scale) {
  if (offload_state_) {
    last_step_fused_ = true;
    offloaded_step(static_cast<float>(gradient_scale));
    return {};
  }
  // Moments a step with offload left on the host come back beside their
  // parameters first.
  for (const auto& group : param_groups()) {
    for (const auto& p : group.params()) {
      const auto it = state().find(compat::optimizer_state_key(p));
      if (it != state().end()) place_state(static_cast<torch::optim::AdamWParamState&>(*it->second), p);
    }
  }
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
    if (offload_state_ || memory::is_host_buffer(p)) {
      // On the host beside a CPU-offloaded parameter too (its own dtype).
      const at::ScalarType dtype = offload_state_ ? at::kFloat : p.scalar_type();
      fresh->exp_avg(memory::empty_host(p.numel(), dtype, pin_memory_).zero_().view(p.sizes()));
      fresh->exp_avg_sq(memory::empty_host(p.numel(), dtype, pin_memory_).zero_().view(p.sizes()));
    } else {
      fresh->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
      fresh->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
    }
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

namespace {

// One parameter's update as the fused loop takes it, over fp32 `param`,
// `grad` and the state's moments. As torch::optim::AdamW: corrections and
// step size in double, then each rounded to float where its tensor op
// would round it.
kernels::AdamWSegment segment_of(const torch::optim::AdamWOptions& o, const torch::optim::AdamWParamState& s,
                                 const at::Tensor& param, const at::Tensor& grad, float gradient_scale) {
  const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(s.step()));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(s.step()));
  kernels::AdamWSegment seg;
  seg.param = param.data_ptr<float>();
  seg.grad = grad.data_ptr<float>();
  seg.exp_avg = s.exp_avg().data_ptr<float>();
  seg.exp_avg_sq = s.exp_avg_sq().data_ptr<float>();
  seg.numel = param.numel();
  seg.decay = static_cast<float>(o.weight_decay() != 0 ? 1 - o.lr() * o.weight_decay() : 1.0);
  seg.beta1 = static_cast<float>(beta1);
  seg.one_minus_beta1 = static_cast<float>(1 - beta1);
  seg.beta2 = static_cast<float>(beta2);
  seg.one_minus_beta2 = static_cast<float>(1 - beta2);
  seg.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  seg.eps = static_cast<float>(o.eps());
  seg.neg_step_size = static_cast<float>(-(o.lr() / bias_correction1));
  seg.grad_scale = gradient_scale;
  return seg;
}

// The segments laid end to end.
struct SegmentList {
  std::vector<kernels::AdamWSegment> segments;
  std::vector<int64_t> starts;  // each segment's first element in the virtual concatenation
  int64_t total = 0;
  void add(const kernels::AdamWSegment& seg) {
    segments.push_back(seg);
    starts.push_back(total);
    total += seg.numel;
  }
};

// One parallel pass over all segments as if they were one flat buffer: a
// thread's range may start inside one parameter and end in another.
// `serial`: on the calling thread alone.
void run_segments(const SegmentList& list, bool serial = false) {
  const auto& segments = list.segments;
  const auto& starts = list.starts;
  if (serial) {
    for (const auto& seg : segments) kernels::adamw_update(seg, 0, seg.numel);
    return;
  }
  at::parallel_for(0, list.total, kGrain, [&](int64_t begin, int64_t end) {
    auto i = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() - 1);
    for (; begin < end; ++i) {
      const int64_t stop = std::min(end, starts[i] + segments[i].numel);
      kernels::adamw_update(segments[i], begin - starts[i], stop - starts[i]);
      begin = stop;
    }
  });
}

}  // namespace

void FusedAdamW::fused_step(float gradient_scale) {
  torch::NoGradGuard no_grad;
  RECORD_USER_SCOPE("fsdp::fused_adamw");
  SegmentList list;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined() || p.numel() == 0) continue;
      list.add(segment_of(o, stepped_state(p), p, p.grad(), gradient_scale));
    }
  }
  run_segments(list);
}

void FusedAdamW::step_params(const std::vector<torch::Tensor>& params, double gradient_scale, bool serial) {
  torch::NoGradGuard no_grad;
  RECORD_USER_SCOPE("fsdp::fused_adamw_unit");
  FSDP_CHECK(!offload_state_, "FusedAdamW::step_params: not with the state offloaded (set_state_offload)");
  std::unordered_set<const void*> wanted;
  for (const auto& p : params) wanted.insert(p.unsafeGetTensorImpl());
  SegmentList list;
  size_t found = 0;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (wanted.count(p.unsafeGetTensorImpl()) == 0) continue;
      ++found;
      if (!p.grad().defined() || p.numel() == 0) continue;
      FSDP_CHECK(!o.amsgrad() && fusable_tensor(p, p) && fusable_tensor(p.grad(), p),
                 "FusedAdamW::step_params: a parameter of ", p.scalar_type(), " on ", p.device(),
                 " (expected a contiguous fp32 CPU parameter and gradient, amsgrad off)");
      auto& s = stepped_state(p);
      place_state(s, p);
      list.add(segment_of(o, s, p, p.grad(), static_cast<float>(gradient_scale)));
    }
  }
  FSDP_CHECK(found == wanted.size(), "FusedAdamW::step_params: ", wanted.size() - found,
             " of the parameters given are not this optimizer's");
  run_segments(list, serial);
}

// [Note: optimizer offload]
// Megatron-FSDP's optimizer offload, on the host's cores: every gradient
// and parameter copied to the host in fp32 (device to host), one fused pass
// over all of them with the moments kept there, and the parameters copied
// back (host to device, rounding a bf16 parameter once). On a CPU-only build
// the copies are real, into host buffers of their own, so a copy left out
// shows as a parameter that did not move.
void FusedAdamW::offloaded_step(float gradient_scale) {
  torch::NoGradGuard no_grad;
  RECORD_USER_SCOPE("fsdp::fused_adamw_offloaded");
  struct Staged {
    at::Tensor param;       // the parameter, where it lives
    at::Tensor host_param;  // [numel] fp32 on the host
    at::Tensor host_grad;   // [numel] fp32 on the host
  };
  std::vector<Staged> staged;
  std::vector<at::Device> devices;
  for (auto& group : param_groups()) {
    FSDP_CHECK(!static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad(),
               "FusedAdamW: optimizer offload does not keep amsgrad's maximum; turn amsgrad off");
    for (auto& p : group.params()) {
      if (!p.grad().defined() || p.numel() == 0) continue;
      FSDP_CHECK(at::isFloatingType(p.scalar_type()) && p.grad().layout() == at::kStrided,
                 "FusedAdamW: optimizer offload steps dense floating-point parameters; got ", p.scalar_type(),
                 " with a ", p.grad().layout(), " gradient");
      staged.push_back({p, memory::host_copy(p, at::kFloat, pin_memory_), memory::host_copy(p.grad(), at::kFloat, pin_memory_)});
      if (std::find(devices.begin(), devices.end(), p.device()) == devices.end()) devices.push_back(p.device());
    }
  }
  for (const auto& d : devices) memory::wait_for_copies(d);
  SegmentList list;
  size_t next = 0;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined() || p.numel() == 0) continue;
      const Staged& st = staged[next++];
      auto& s = stepped_state(p);
      place_state(s, p);
      list.add(segment_of(o, s, st.host_param, st.host_grad, gradient_scale));
    }
  }
  run_segments(list);
  for (const Staged& st : staged) st.param.copy_(st.host_param.view(st.param.sizes()), /*non_blocking=*/true);
}

void FusedAdamW::place_state(torch::optim::AdamWParamState& s, const torch::Tensor& p) const {
  // Host memory under offload (fp32), and beside a CPU-offloaded parameter
  // (its dtype); else the parameter's device.
  const bool host = offload_state_ || memory::is_host_buffer(p);
  const at::ScalarType dtype = offload_state_ ? at::kFloat : p.scalar_type();
  const auto placed = [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    const bool right_side = host ? memory::is_host_buffer(t) : !memory::is_host_buffer(t) && t.device() == p.device();
    if (right_side && t.scalar_type() == dtype && t.is_contiguous()) return t;
    if (host) return memory::host_copy(t, dtype, pin_memory_).view(t.sizes());
    return at::empty(t.sizes(), p.options()).copy_(t);
  };
  s.exp_avg(placed(s.exp_avg()));
  s.exp_avg_sq(placed(s.exp_avg_sq()));
  if (s.max_exp_avg_sq().defined()) s.max_exp_avg_sq(placed(s.max_exp_avg_sq()));
}

}  // namespace fsdp::optim
