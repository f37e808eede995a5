// Qwen3 and Qwen3-MoE: presets and Hugging Face adapters over the shared
// decoder (llama/model.h), which implements q/k norms and sparse blocks.

#include "fsdp/models/family.h"
#include "fsdp/models/llama/model.h"
#include "fsdp/models/llama/shape.h"
#include "fsdp/models/qwen3/config.h"

namespace fsdp::models {

namespace {
FamilySpec qwen3_spec(const std::string& name, const std::vector<std::string>& presets,
                      LlamaConfig (*from_hf)(const nlohmann::json&, const std::string&)) {
  FamilySpec f;
  f.name = name;
  f.presets = presets;
  f.build_preset = [](const std::string& preset, double dropout) -> CausalLM {
    auto c = qwen3_preset(preset);
    c.attention_dropout = dropout;
    return std::make_shared<LlamaForCausalLMImpl>(c);
  };
  f.preset_vocab_size = [](const std::string& preset) { return qwen3_preset(preset).vocab_size; };
  f.preset_parameter_count = [](const std::string& preset) { return llama_parameter_count(qwen3_preset(preset)); };
  f.from_hf = [from_hf](const nlohmann::json& j, const std::string& where) -> CausalLM {
    return std::make_shared<LlamaForCausalLMImpl>(from_hf(j, where));
  };
  f.to_hf = [](const CausalLMImpl& m) {
    return qwen3_config_to_hf(dynamic_cast<const LlamaForCausalLMImpl&>(m).config);
  };
  // Tied checkpoints may hold the head as well (it is the embedding).
  f.ignored_hf_tensor = [](const std::string& key) { return key == "lm_head.weight"; };
  f.shape = [](const CausalLMImpl& m) { return llama_shape(dynamic_cast<const LlamaForCausalLMImpl&>(m).config); };
  return f;
}
}  // namespace

FamilySpec qwen3_family() { return qwen3_spec("qwen3", qwen3_preset_names(), qwen3_config_from_hf); }
FamilySpec qwen3_moe_family() { return qwen3_spec("qwen3_moe", qwen3_moe_preset_names(), qwen3_moe_config_from_hf); }

}  // namespace fsdp::models
