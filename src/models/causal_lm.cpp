#include "fsdp/models/causal_lm.h"

#include "fsdp/core/fully_shard.h"

namespace fsdp::models {

int64_t count_parameters(const torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& [name, shape] : parameter_shapes(model)) {
    (void)name;
    n += c10::multiply_integers(shape);
  }
  return n;
}

int64_t CausalLMImpl::active_parameter_count() const { return count_parameters(*this); }

}  // namespace fsdp::models
