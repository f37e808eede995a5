#pragma once
// LoRA (Hu et al., 2021) on the models' Linear layers, as PEFT applies it:
// y = x W^T + b + (alpha / r) * B(A(dropout(x))), A (r, in) drawn as
// PEFT's kaiming_uniform(a = sqrt(5)), B (out, r) zero, so a fresh adapter
// leaves the model's output unchanged. The adapters live inside the
// layer (`q_proj.lora_A.weight`, PEFT's names less its adapter name), so
// fully_shard puts each beside its frozen base in the same unit.

#include <string>
#include <vector>

#include <torch/torch.h>

namespace fsdp::nn {

struct LoraOptions {
  int64_t rank = 0;  // r; 0: no LoRA
  double alpha = 16;
  double dropout = 0;
  // Layer names (the last part of a module's name, "q_proj") to adapt;
  // {"all-linear"}: every Linear but the output head and a
  // Mixture-of-Experts router.
  std::vector<std::string> targets{"all-linear"};
  double scale() const { return alpha / static_cast<double>(rank); }
};

// Adds adapters to `model`'s matching Linear layers and freezes every other
// parameter. Returns the adapted layers' module names ("model.layers.0.
// self_attn.q_proj"). Throws naming the targets when none matches, or a
// target that matches no Linear. Inside a DeferredInit scope the adapters
// are deferred too (shapes only, for fsdp plan).
std::vector<std::string> add_lora(torch::nn::Module& model, const LoraOptions& options);

// Whether parameter name `fqn` is an adapter's ("....lora_A.weight").
bool is_lora_parameter(const std::string& fqn);

// Full parameters (name, value) with each adapted layer's adapters folded
// into its weight, W + scale * B A (in fp32: a bf16 base is not rounded
// back), and the adapters dropped: the model as a plain one.
std::vector<std::pair<std::string, torch::Tensor>> merge_lora(
    const std::vector<std::pair<std::string, torch::Tensor>>& params, double scale);

// While one lives, every adapted layer computes its base alone: the model
// as it was before its adapters, which DPO under LoRA takes as its
// reference (PEFT's disable_adapter). Process-wide: a forward runs on one
// thread at a time, and so does activation checkpointing's recompute.
class AdaptersOff {
 public:
  AdaptersOff();
  ~AdaptersOff();
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;
};
bool adapters_off();

}  // namespace fsdp::nn
