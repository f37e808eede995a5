#include "fsdp/models/causal_lm.h"

#include "fsdp/core/fully_shard.h"

namespace fsdp::models {

int64_t count_parameters(const torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : unique_parameters(model)) n += static_cast<int64_t>(unsharded_shape(p).empty() ? 1 : c10::multiply_integers(unsharded_shape(p)));
  return n;
}

}  // namespace fsdp::models
