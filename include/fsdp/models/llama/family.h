#pragma once
// The registry entry of a family whose model is the Llama decoder (Llama,
// Mistral, Qwen3, Qwen3-MoE): built from its presets and its config.json
// adapter; the builders, shape and checkpoint rules are the decoder's.

#include <functional>
#include <string>
#include <vector>

#include "fsdp/models/family.h"
#include "fsdp/models/llama/config.h"

namespace fsdp::models {

struct LlamaDecoderFamily {
  std::string name;
  std::vector<std::string> presets;
  std::function<LlamaConfig(const std::string& preset)> preset;
  std::function<LlamaConfig(const nlohmann::json& config, const std::string& where)> from_hf;
  std::function<nlohmann::json(const LlamaConfig& config)> to_hf;
};

FamilySpec llama_decoder_family(const LlamaDecoderFamily& family);

}  // namespace fsdp::models
