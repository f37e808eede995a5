#pragma once
// GPT-2's architecture, its presets, and its Hugging Face config.json
// (GPT2LMHeadModel): everything about the family that needs no LibTorch.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace fsdp::models {

struct GPT2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  double layer_norm_epsilon = 1e-5;
  double embd_pdrop = 0.0;
  double attn_pdrop = 0.0;
  double resid_pdrop = 0.0;
};

// gpt2-tiny (tests), gpt2-mini (4 x 128, the demo), gpt2-d6 (6 x 384), gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl.
const std::vector<std::string>& gpt2_preset_names();
GPT2Config gpt2_preset(const std::string& name);
bool is_gpt2_preset(const std::string& name);
// Parameters of the model with its tied head, from the configuration alone.
int64_t gpt2_parameter_count(const GPT2Config& config);

// config.json <-> GPT2Config. Reading refuses keys that would change the
// architecture and are not implemented (see hf::ConfigReader).
GPT2Config gpt2_config_from_hf(const nlohmann::json& config, const std::string& where);
nlohmann::json gpt2_config_to_hf(const GPT2Config& config);

}  // namespace fsdp::models
