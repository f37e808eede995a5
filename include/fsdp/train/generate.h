#pragma once
// Sampling text from a causal language model (temperature, top-k). Under
// FSDP every rank must run it (forward is collective); with the same seed
// every rank draws the same tokens.

#include <cstdint>
#include <vector>

#include "fsdp/models/causal_lm.h"

namespace fsdp::train {

struct SampleOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: the whole vocabulary
  uint64_t seed = 42;
};

std::vector<int32_t> generate(const models::CausalLM& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& options);

}  // namespace fsdp::train
