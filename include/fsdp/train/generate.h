#pragma once
// Sampling text from a causal language model (temperature, top-k, top-p,
// stopping at end-of-text ids). Under FSDP every rank must run it (forward
// is collective); with the same seed every rank draws the same tokens.

#include <cstdint>
#include <functional>
#include <vector>

#include "fsdp/models/causal_lm.h"

namespace fsdp::train {

struct SampleOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: the whole vocabulary
  // Nucleus sampling, after top-k: the likeliest tokens whose probabilities
  // first reach top_p (the one that crosses it included, as transformers'
  // TopPLogitsWarper keeps it); 1: all of them.
  double top_p = 1.0;
  uint64_t seed = 42;
  // Ids that end a text (generation_config.json's eos_token_id): generation
  // stops after producing one, which is returned last.
  std::vector<int64_t> stop_ids;
  // Asked after each new token with everything generated so far: true ends
  // the text there (`fsdp generate --stop`: the continuation holds a stop
  // string).
  std::function<bool(const std::vector<int32_t>&)> stop_when;
};

std::vector<int32_t> generate(const models::CausalLM& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& options);

}  // namespace fsdp::train
