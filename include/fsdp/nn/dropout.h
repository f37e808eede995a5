#pragma once
// Dropout as the models apply it. On the CPU in fp32 and bf16 the mask
// comes from a counter-based generator (kernels::dropout_apply) keyed by
// one draw from LibTorch's default CPU generator per call, where
// torch::nn::Dropout draws a Bernoulli variate per element (the largest
// element-wise cost of a step with dropout on). Backward recomputes the
// mask from the key instead of storing it. Activation checkpointing
// restores the default generator before recomputing, so a recomputed call
// draws the same key and drops the same elements. Elsewhere (a GPU, other
// dtypes) it is the module's own dropout.

#include <torch/nn/modules/dropout.h>
#include <torch/types.h>

namespace fsdp::nn {

// `module`'s dropout of `x`: x itself when the module is in eval mode or
// its probability is 0.
torch::Tensor dropout(torch::nn::Dropout& module, const torch::Tensor& x);

// One key for a call's mask, drawn from the default CPU generator as
// `dropout` draws it (for kernels that drop inside, such as attention's).
uint64_t dropout_key();

// The CPU kernel with key `seed`, no autograd: for tests that check the
// mask (elements dropped with probability p, the rest scaled by 1/(1-p)).
torch::Tensor dropout_with_seed(const torch::Tensor& x, double p, uint64_t seed);

}  // namespace fsdp::nn
