#pragma once
// Activation checkpointing: run a function without keeping its
// intermediate activations, and run it again in backward to get them.
// The CPU random state is saved before the first run and restored for the
// recomputation, so dropout draws the same masks both times.

#include <functional>

#include <torch/torch.h>

namespace fsdp::nn {

using CheckpointedFn = std::function<torch::Tensor(const torch::Tensor&)>;

// fn(input) with activations recomputed in backward. Gradients reach
// `input` and every tensor `fn` uses that requires grad (its parameters).
torch::Tensor checkpoint(const CheckpointedFn& fn, const torch::Tensor& input);

}  // namespace fsdp::nn
