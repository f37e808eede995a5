#include "fsdp/models/moe/config.h"

#include <algorithm>

namespace fsdp::models {

bool MoEConfig::is_sparse(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

std::vector<int64_t> MoEConfig::sparse_layers(int64_t layers) const {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < layers; ++i) {
    if (is_sparse(i)) out.push_back(i);
  }
  return out;
}

void MoEConfig::set_sparse_layers(const std::vector<int64_t>& sparse, int64_t layers) {
  decoder_sparse_step = 1;
  mlp_only_layers.clear();
  for (int64_t i = 0; i < layers; ++i) {
    if (std::find(sparse.begin(), sparse.end(), i) == sparse.end()) mlp_only_layers.push_back(i);
  }
}

}  // namespace fsdp::models
