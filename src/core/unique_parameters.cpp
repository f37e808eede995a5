#include "fsdp/core/unique_parameters.h"

#include <unordered_set>

namespace fsdp {

std::vector<std::pair<std::string, at::Tensor>> unique_named_parameters(const torch::nn::Module& root) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : root.named_parameters(/*recurse=*/true)) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) out.emplace_back(item.key(), item.value());
  }
  return out;
}

std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  for (const auto& [name, param] : unique_named_parameters(module)) out.push_back(param);
  return out;
}

}  // namespace fsdp
