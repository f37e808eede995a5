#pragma once
// A small residual network for the tests of FSDP off the happy path: frozen
// parameters beside trainable adapters (LoRA-style), a block applied twice,
// a parameter used only in some steps, blocks that throw in forward or
// backward on request, and blocks run in checkpointed regions.
// Single-device code: blocks (and their base projections, units of their
// own in the nested tests) go through fsdp::call, which is plain forward
// when FSDP is not applied.

#include <stdexcept>

#include <torch/torch.h>

#include "fsdp/core/fully_shard.h"
#include "fsdp/nn/activation_checkpoint.h"

namespace fsdp::testing {

struct AdapterNetConfig {
  int64_t dim = 23;   // no unit's size divides by 2, 3 or 4: padding is exercised
  int64_t rank = 3;   // adapter width
  int64_t blocks = 3;
  bool adapters = false;    // lora_a/lora_b beside each block's base projection
  bool gate = false;        // a per-block gate vector, used only when use_gate
  int twice_block = -1;     // this block is applied twice in a row
  bool checkpoint = false;  // each block call is a checkpointed region of its own
  // Linear layers may be in another dtype than the norms (bf16 matrices
  // beside fp32 norms): each is applied in its weight's dtype, its output
  // cast back to its input's.
  bool own_dtype_linears = false;
};

inline torch::Tensor apply_linear(torch::nn::Linear& m, const torch::Tensor& x, bool own_dtype) {
  if (!own_dtype) return fsdp::call(m, x);
  return fsdp::call(m, x.to(m->weight.scalar_type())).to(x.scalar_type());
}

// Fails in backward: autograd surfaces the exception from loss.backward().
struct ThrowInBackward : torch::autograd::Function<ThrowInBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const torch::Tensor& x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list /*grads*/) {
    throw std::runtime_error("injected failure in backward");
  }
};

// B = batch, C = channels
struct AdapterBlockImpl : torch::nn::Module {
  explicit AdapterBlockImpl(const AdapterNetConfig& c)
      : own_dtype(c.own_dtype_linears),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        base(register_module("base", torch::nn::Linear(c.dim, c.dim))) {
    if (c.adapters) {
      lora_a = register_module("lora_a", torch::nn::Linear(torch::nn::LinearOptions(c.dim, c.rank).bias(false)));
      lora_b = register_module("lora_b", torch::nn::Linear(torch::nn::LinearOptions(c.rank, c.dim).bias(false)));
    }
    if (c.gate) gate = register_parameter("gate", torch::rand({c.dim}) + 0.5);
  }

  torch::Tensor forward(torch::Tensor x) {  // (B, C)
    if (throw_in_forward) throw std::runtime_error("injected failure in forward");
    torch::Tensor h = norm(x);
    torch::Tensor y = apply_linear(base, h, own_dtype);
    if (lora_a) y = y + apply_linear(lora_b, apply_linear(lora_a, h, own_dtype), own_dtype);
    if (gate.defined() && use_gate) y = y * gate;
    if (throw_in_backward) y = ThrowInBackward::apply(y);
    return x + torch::tanh(y);
  }

  bool own_dtype;
  torch::nn::LayerNorm norm;
  torch::nn::Linear base;
  torch::nn::Linear lora_a{nullptr}, lora_b{nullptr};
  torch::Tensor gate;
  bool throw_in_forward = false;
  bool throw_in_backward = false;
  bool use_gate = true;
};
TORCH_MODULE(AdapterBlock);

struct AdapterNetImpl : torch::nn::Module {
  explicit AdapterNetImpl(const AdapterNetConfig& c)
      : config(c),
        in_proj(register_module("in_proj", torch::nn::Linear(c.dim, c.dim))),
        head(register_module("head", torch::nn::Linear(c.dim, 2))) {
    for (int64_t i = 0; i < c.blocks; ++i) blocks.push_back(register_module("b" + std::to_string(i), AdapterBlock(c)));
  }

  torch::Tensor forward(torch::Tensor x) {  // (B, C) -> (B, 2)
    const bool own = config.own_dtype_linears;
    torch::Tensor h = apply_linear(in_proj, x, own);  // units of their own in the list-form tests
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (static_cast<int>(i) == skipped_block) continue;
      h = call_block(i, h);
      if (static_cast<int>(i) == config.twice_block) h = call_block(i, h);
    }
    return apply_linear(head, h, own);
  }

  torch::Tensor call_block(size_t i, const torch::Tensor& h) {
    if (!config.checkpoint) return fsdp::call(blocks[i], h);
    return fsdp::nn::checkpoint([this, i](const torch::Tensor& x) { return fsdp::call(blocks[i], x); }, h);
  }

  // Freezes every block's norm and base projection (the adapters and the
  // rest stay trainable), as LoRA fine-tuning does.
  void freeze_bases() {
    for (auto& b : blocks) {
      for (auto& p : b->norm->parameters()) p.set_requires_grad(false);
      for (auto& p : b->base->parameters()) p.set_requires_grad(false);
    }
  }
  // Every linear layer in `dtype`, the norms and gates left in fp32.
  void linears_to(torch::Dtype dtype, bool adapters_too) {
    in_proj->to(dtype);
    head->to(dtype);
    for (auto& b : blocks) {
      b->base->to(dtype);
      if (adapters_too && b->lora_a) {
        b->lora_a->to(dtype);
        b->lora_b->to(dtype);
      }
    }
  }
  // Only the adapters train, as in LoRA fine-tuning of a whole model.
  void freeze_all_but_adapters() {
    for (auto& p : parameters()) p.set_requires_grad(false);
    for (auto& b : blocks) {
      for (auto& p : b->lora_a->parameters()) p.set_requires_grad(true);
      for (auto& p : b->lora_b->parameters()) p.set_requires_grad(true);
    }
  }
  void freeze_block(size_t i) {
    for (auto& p : blocks[i]->parameters()) p.set_requires_grad(false);
  }

  AdapterNetConfig config;
  int skipped_block = -1;  // this block is not run (a conditional path)
  torch::nn::Linear in_proj, head;
  std::vector<AdapterBlock> blocks;
};
TORCH_MODULE(AdapterNet);

inline AdapterNet make_adapter_net(const AdapterNetConfig& c, uint64_t seed) {
  torch::manual_seed(seed);
  return AdapterNet(c);
}

}  // namespace fsdp::testing
