// Llama 2, 3, 3.1 and 3.2: presets and the Hugging Face adapter (LlamaForCausalLM).

#include <nlohmann/json.hpp>

#include "fsdp/models/family.h"
#include "fsdp/models/llama/config.h"
#include "fsdp/models/llama/model.h"
#include "fsdp/models/llama/shape.h"

namespace fsdp::models {

FamilySpec llama_family() {
  FamilySpec f;
  f.name = "llama";
  f.presets = llama_preset_names();
  f.build_preset = [](const std::string& name, double dropout) -> CausalLM {
    auto c = llama_preset(name);
    c.attention_dropout = dropout;
    return std::make_shared<LlamaForCausalLMImpl>(c);
  };
  f.preset_vocab_size = [](const std::string& name) { return llama_preset(name).vocab_size; };
  f.preset_parameter_count = [](const std::string& name) { return llama_parameter_count(llama_preset(name)); };
  f.from_hf = [](const nlohmann::json& j, const std::string& where) -> CausalLM {
    return std::make_shared<LlamaForCausalLMImpl>(llama_config_from_hf(j, where));
  };
  f.to_hf = [](const CausalLMImpl& m) {
    return llama_config_to_hf(dynamic_cast<const LlamaForCausalLMImpl&>(m).config);
  };
  // Older exports kept the rotary table; tied checkpoints may hold the
  // head too (it is the embedding).
  f.ignored_hf_tensor = [](const std::string& key) {
    return key.find("rotary_emb.inv_freq") != std::string::npos || key == "lm_head.weight";
  };
  f.shape = [](const CausalLMImpl& m) { return llama_shape(dynamic_cast<const LlamaForCausalLMImpl&>(m).config); };
  return f;
}

}  // namespace fsdp::models
