#pragma once
// What a checkpoint reads from and writes into a LibTorch optimizer, by its
// kind: SGD, Adam, AdamW (the project's FusedAdamW among them), RMSprop and
// Adagrad. Each holds, per parameter, a step count and tensors shaped like
// the parameter (momentum, moments, sums), which a checkpoint shards as it
// shards the parameter; and, per parameter group, its hyperparameters.
// torch.optim's state_dict holds the same: "state" and "param_groups".

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

namespace fsdp::checkpoint {

// "sgd", "adam", "adamw", "rmsprop" or "adagrad". Throws fsdp::Error naming
// the kinds a checkpoint holds for any other optimizer (LBFGS, whose state
// is not per parameter, or a class of the program's own).
std::string optimizer_kind(const torch::optim::Optimizer& optimizer);

// Every per-parameter tensor `kind` may hold, in a fixed order (a saved
// checkpoint lists those a parameter had).
const std::vector<std::string>& optimizer_state_tensors(const std::string& kind);

// One parameter's state: its step count (0 for SGD, which counts none) and
// the tensors it holds, in optimizer_state_tensors' order; undefined ones
// (SGD without momentum, AdamW without amsgrad's maximum) left out.
struct ParamState {
  int64_t step = 0;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};
ParamState read_param_state(const std::string& kind, const torch::optim::OptimizerParamState& state);
std::unique_ptr<torch::optim::OptimizerParamState> make_param_state(const std::string& kind, const ParamState& state);

// A parameter group's hyperparameters as JSON ({"lr": ..., "betas": [...]}),
// and back: set_group_options throws naming the key for one missing or of
// the wrong type.
nlohmann::json group_options(const std::string& kind, const torch::optim::OptimizerOptions& options);
void set_group_options(const std::string& kind, torch::optim::OptimizerOptions& options, const nlohmann::json& saved,
                       const std::string& where);

}  // namespace fsdp::checkpoint
