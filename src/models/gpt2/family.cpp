// GPT-2: its presets and its Hugging Face adapter (GPT2LMHeadModel).

#include <nlohmann/json.hpp>

#include "fsdp/models/family.h"
#include "fsdp/models/gpt2/config.h"
#include "fsdp/models/gpt2/model.h"

namespace fsdp::models {

FamilySpec gpt2_family() {
  FamilySpec f;
  f.name = "gpt2";
  f.presets = gpt2_preset_names();
  f.build_preset = [](const std::string& name, double dropout) -> CausalLM {
    auto c = gpt2_preset(name);
    c.embd_pdrop = c.attn_pdrop = c.resid_pdrop = dropout;
    return std::make_shared<GPT2LMHeadModelImpl>(c);
  };
  f.preset_vocab_size = [](const std::string& name) { return gpt2_preset(name).vocab_size; };
  f.preset_parameter_count = [](const std::string& name) { return gpt2_parameter_count(gpt2_preset(name)); };
  f.from_hf = [](const nlohmann::json& j, const std::string& where) -> CausalLM {
    return std::make_shared<GPT2LMHeadModelImpl>(gpt2_config_from_hf(j, where));
  };
  f.to_hf = [](const CausalLMImpl& m) {
    return gpt2_config_to_hf(dynamic_cast<const GPT2LMHeadModelImpl&>(m).config);
  };
  // The original gpt2 weights were saved from GPT2Model: no "transformer."
  // prefix, and the causal-mask buffers (attn.bias, attn.masked_bias).
  f.hf_keys = [](const std::string& fqn) {
    std::vector<std::string> keys = {fqn};
    const std::string prefix = "transformer.";
    if (fqn.rfind(prefix, 0) == 0) keys.push_back(fqn.substr(prefix.size()));
    return keys;
  };
  f.ignored_hf_tensor = [](const std::string& key) {
    const auto ends_with = [&](const std::string& s) {
      return key.size() >= s.size() && key.compare(key.size() - s.size(), s.size(), s) == 0;
    };
    return ends_with("attn.bias") || ends_with("attn.masked_bias") || key == "lm_head.weight";
  };
  return f;
}

}  // namespace fsdp::models
