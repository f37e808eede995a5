#pragma once
// A module's parameters with tied ones once, for optimizers and for both
// wrappers: a module tree's own, whether sharded, replicated or neither.

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

namespace fsdp {

// Parameters of `module` with shared (tied) ones once: LibTorch's
// Module::parameters() lists a tied parameter once per module holding it,
// which an optimizer would step twice.
std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module);
// The same with names: root.named_parameters() with tied parameters once, under their first name.
std::vector<std::pair<std::string, at::Tensor>> unique_named_parameters(const torch::nn::Module& root);

}  // namespace fsdp
