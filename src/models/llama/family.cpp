// Llama 2, 3, 3.1 and 3.2: presets and the Hugging Face adapter
// (LlamaForCausalLM); and the registry entry every family on the Llama
// decoder shares.

#include "fsdp/models/llama/family.h"

#include <nlohmann/json.hpp>

#include "fsdp/models/llama/model.h"
#include "fsdp/models/llama/shape.h"

namespace fsdp::models {

FamilySpec llama_decoder_family(const LlamaDecoderFamily& d) {
  FamilySpec f;
  f.name = d.name;
  f.presets = d.presets;
  f.build_preset = [preset = d.preset](const std::string& name, double dropout) -> CausalLM {
    auto c = preset(name);
    c.attention_dropout = dropout;
    return std::make_shared<LlamaForCausalLMImpl>(c);
  };
  f.preset_vocab_size = [preset = d.preset](const std::string& name) { return preset(name).vocab_size; };
  f.preset_parameter_count = [preset = d.preset](const std::string& name) {
    return llama_parameter_count(preset(name));
  };
  f.from_hf = [from_hf = d.from_hf](const nlohmann::json& j, const std::string& where) -> CausalLM {
    return std::make_shared<LlamaForCausalLMImpl>(from_hf(j, where));
  };
  f.to_hf = [to_hf = d.to_hf](const CausalLMImpl& m) {
    return to_hf(dynamic_cast<const LlamaForCausalLMImpl&>(m).config);
  };
  // Older exports kept the rotary table; tied checkpoints may hold the
  // head too (it is the embedding).
  f.ignored_hf_tensor = [](const std::string& key) {
    return key.find("rotary_emb.inv_freq") != std::string::npos || key == "lm_head.weight";
  };
  f.shape = [](const CausalLMImpl& m) { return llama_shape(dynamic_cast<const LlamaForCausalLMImpl&>(m).config); };
  return f;
}

FamilySpec llama_family() {
  return llama_decoder_family({"llama", llama_preset_names(), llama_preset, llama_config_from_hf, llama_config_to_hf});
}

}  // namespace fsdp::models
