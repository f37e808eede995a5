#pragma once
// Activation checkpointing: run a function without keeping its
// intermediate activations, and run it again in backward to get them.
// The CPU random state is saved before the first run and restored for the
// recomputation, so dropout draws the same masks both times.

#include <functional>
#include <tuple>
#include <vector>

#include <torch/torch.h>

namespace fsdp::nn {

using CheckpointedFn = std::function<torch::Tensor(const torch::Tensor&)>;
using CheckpointedMultiFn = std::function<std::vector<torch::Tensor>(const torch::Tensor&)>;

// fn(input) with activations recomputed in backward. Gradients reach
// `input` and every tensor `fn` uses that requires grad (its parameters).
torch::Tensor checkpoint(const CheckpointedFn& fn, const torch::Tensor& input);
// The same for a function with several outputs (a block that also returns
// router statistics); each output may receive a gradient.
std::vector<torch::Tensor> checkpoint(const CheckpointedMultiFn& fn, const torch::Tensor& input);

// A transformer block's forward, checkpointed when `enabled`: its first
// output and its second (a MoE block's router statistics), undefined when
// `fn` returns one tensor.
std::tuple<torch::Tensor, torch::Tensor> maybe_checkpoint(bool enabled, const CheckpointedMultiFn& fn,
                                                          const torch::Tensor& input);

}  // namespace fsdp::nn
