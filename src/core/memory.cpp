#include "fsdp/core/memory.h"

#include <algorithm>
#include <unordered_set>

#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "fsdp/common/host_buffer.h"
#include "fsdp/core/fully_shard.h"

namespace fsdp {
namespace memory {
int64_t gathered_bytes() { return current_bytes(BufferKind::kGathered); }
int64_t peak_gathered_bytes() { return peak_bytes(BufferKind::kGathered); }
void reset_peak() { reset_peaks(); }

}  // namespace memory

namespace {

int64_t bytes(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }
int64_t host_bytes(const at::Tensor& t) { return memory::is_host_buffer(t) ? bytes(t) : 0; }

// LibTorch's optimizer states expose their tensors only through their
// concrete types; these are the ones fsdp.cpp's trainer uses.
// `count` is bytes or host_bytes.
int64_t optimizer_state_tensor_bytes(const torch::optim::OptimizerParamState& state, int64_t (*count)(const at::Tensor&)) {
  if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    return count(s->exp_avg()) + count(s->exp_avg_sq()) + count(s->max_exp_avg_sq());
  }
  if (const auto* s = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    return count(s->exp_avg()) + count(s->exp_avg_sq()) + count(s->max_exp_avg_sq());
  }
  if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    return count(s->momentum_buffer());
  }
  return 0;
}

}  // namespace

MemoryStats memory_stats(const torch::nn::Module& module, const torch::optim::Optimizer* optimizer) {
  MemoryStats stats;
  std::unordered_set<const void*> seen;
  for (const auto& param : module.parameters()) {
    if (!seen.insert(param.unsafeGetTensorImpl()).second) continue;
    stats.grad_bytes += bytes(param.grad());
    stats.host_grad_bytes += host_bytes(param.grad());
  }
  stats.sharded_param_bytes = sharded_param_bytes(module);
  stats.host_param_bytes = host_param_bytes(module);
  if (optimizer != nullptr) {
    for (const auto& [key, state] : optimizer->state()) {
      (void)key;
      stats.optimizer_state_bytes += optimizer_state_tensor_bytes(*state, &bytes);
      stats.host_optimizer_state_bytes += optimizer_state_tensor_bytes(*state, &host_bytes);
    }
  }
  using memory::BufferKind;
  stats.gathered_bytes = memory::current_bytes(BufferKind::kGathered);
  stats.peak_gathered_bytes = memory::peak_bytes(BufferKind::kGathered);
  stats.unsharded_grad_bytes = memory::current_bytes(BufferKind::kGradient);
  stats.peak_unsharded_grad_bytes = memory::peak_bytes(BufferKind::kGradient);
  stats.comm_bytes = memory::current_bytes(BufferKind::kComm);
  stats.peak_comm_bytes = memory::peak_bytes(BufferKind::kComm);
  stats.transient_bytes = memory::current_total_bytes();
  stats.peak_transient_bytes = memory::peak_total_bytes();
  return stats;
}

}  // namespace fsdp
