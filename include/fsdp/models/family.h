#pragma once
// One model family as the registry sees it: its presets, how to build it,
// and its Hugging Face adapter (config.json both ways, parameter names,
// tensors a checkpoint may hold that are not parameters), its shapes and
// memory formula. Each family's folder defines one in its family.cpp
// (gpt2/family.cpp: gpt2_family()); the registry (registry.cpp) declares
// and lists them.

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/models/causal_lm.h"
#include "fsdp/models/shape.h"

namespace fsdp::models {

struct FamilySpec {
  std::string name;  // also config.json's model_type, where there is one
  std::vector<std::string> presets;
  std::function<CausalLM(const std::string& preset, double dropout)> build_preset;
  std::function<int64_t(const std::string& preset)> preset_vocab_size;
  std::function<int64_t(const std::string& preset)> preset_parameter_count;
  // Null for a family with no Hugging Face equivalent.
  std::function<CausalLM(const nlohmann::json& config, const std::string& where)> from_hf;
  std::function<nlohmann::json(const CausalLMImpl& model)> to_hf;
  // The checkpoint keys a parameter may have, preferred first (the first
  // is what export writes).
  std::function<std::vector<std::string>(const std::string& fqn)> hf_keys = [](const std::string& fqn) {
    return std::vector<std::string>{fqn};
  };
  // Tensors a Hugging Face file may hold that are not parameters here
  // (buffers such as rotary tables, a tied head saved twice).
  std::function<bool(const std::string& key)> ignored_hf_tensor = [](const std::string&) { return false; };
  // Its shapes and memory formula (shape.h), for fsdp plan and the matmul
  // bench; null for a family they do not model.
  std::function<ModelShape(const CausalLMImpl& model)> shape;
  // Said when training starts from such a directory, where part of what it
  // holds is not read (Llama 4's vision tower); empty for most families.
  std::string partial_load_note;
};

}  // namespace fsdp::models
