#pragma once
// Helpers for tests that run `fsdp train`: a small corpus to learn, and the
// losses a run's metrics file recorded.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/models/causal_lm.h"

namespace fsdp::testing {

// A token file (ids < 500) with structure to learn: a repeating sequence of
// 50 tokens with one random token in ten. Returns its path.
std::string small_corpus(const std::string& dir);

std::vector<nlohmann::json> read_metrics(const std::string& path);
// The training losses, one per logged step, in order.
std::vector<double> train_losses(const std::vector<nlohmann::json>& metrics);

bool exists(const std::string& path);

// A one-layer model of PRESET's family with VOCAB rows, written as a
// Hugging Face directory OUT with the tokenizer files of TOKENIZER_DIR.
models::CausalLM write_model_dir(const std::string& preset, int64_t vocab, const std::string& tokenizer_dir,
                                 const std::string& out);

// Every tensor of every rank file of two checkpoints, compared bit for bit.
void expect_same_weights(const std::string& a, const std::string& b);

}  // namespace fsdp::testing
