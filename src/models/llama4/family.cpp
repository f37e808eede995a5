// Llama 4: presets and the Hugging Face adapters, for Llama4ForCausalLM
// (llama4_text) and the language model of Llama4ForConditionalGeneration
// (llama4).

#include <nlohmann/json.hpp>

#include "fsdp/models/family.h"
#include "fsdp/models/llama4/config.h"
#include "fsdp/models/llama4/model.h"
#include "fsdp/models/llama/shape.h"
#include "fsdp/models/moe/shape.h"

namespace fsdp::models {

namespace {
// The Llama decoder's formula with Llama 4's attention and feed-forward:
// chunked layers keep each window's probabilities only, the q/k L2 norm
// (RoPE layers only) its input and rsqrt's output, and a MoE layer adds
// the shared expert beside the routed ones.
ModelShape llama4_shape(const Llama4Config& c) {
  const auto& t = c.text;
  auto s = llama_shape(t);
  s.ffn = c.intermediate_size_mlp;
  const int64_t C = t.hidden_size, I = t.intermediate_size, mlp = c.intermediate_size_mlp;
  const int64_t sparse = static_cast<int64_t>(t.moe.sparse_layers(t.num_hidden_layers).size());
  s.projections = llama_attention_projections(t);
  if (sparse < s.layers) add_swiglu_projections(s.projections, "mlp", C, mlp, sparse > 0 ? s.layers - sparse : 0);
  if (sparse > 0) {
    // The routed experts fused as Hugging Face stores them: x @ W.
    const int64_t E = t.moe.num_experts, k = t.moe.num_experts_per_tok;
    s.projections.push_back({"router", C, E, false, sparse});
    s.projections.push_back({"expert gate_up", C, 2 * I, true, sparse, E, k});
    s.projections.push_back({"expert down", I, C, true, sparse, E, k});
    add_swiglu_projections(s.projections, "shared", C, I, sparse);
  }
  s.block_memory = [c](int64_t layer, const ActivationSizes& sizes) {
    const auto& text = c.text;
    const auto qk = c.use_qk_norm && c.uses_rope(layer) ? QkNorm::kL2 : QkNorm::kNone;
    const bool moe = c.is_moe(layer);
    const auto m = llama_dense_block_memory(text, moe ? 0 : c.intermediate_size_mlp, sizes, qk);
    return moe ? add_routed_memory(m, text.hidden_size, text.moe, text.intermediate_size, sizes) : m;
  };
  return s;
}

FamilySpec llama4_spec(const std::string& name, Llama4Config (*from_hf)(const nlohmann::json&, const std::string&)) {
  FamilySpec f;
  f.name = name;
  f.from_hf = [from_hf](const nlohmann::json& j, const std::string& where) -> CausalLM {
    return std::make_shared<Llama4ForCausalLMImpl>(from_hf(j, where));
  };
  f.to_hf = [](const CausalLMImpl& m) {
    return llama4_config_to_hf(dynamic_cast<const Llama4ForCausalLMImpl&>(m).config);
  };
  f.ignored_hf_tensor = [](const std::string& key) { return key == "lm_head.weight"; };
  f.shape = [](const CausalLMImpl& m) { return llama4_shape(dynamic_cast<const Llama4ForCausalLMImpl&>(m).config); };
  return f;
}
}  // namespace

FamilySpec llama4_text_family() {
  FamilySpec f = llama4_spec("llama4_text", llama4_text_config_from_hf);
  f.presets = llama4_preset_names();
  f.build_preset = [](const std::string& name, double dropout) -> CausalLM {
    auto c = llama4_preset(name);
    c.text.attention_dropout = dropout;
    return std::make_shared<Llama4ForCausalLMImpl>(c);
  };
  f.preset_vocab_size = [](const std::string& name) { return llama4_preset(name).text.vocab_size; };
  f.preset_parameter_count = [](const std::string& name) { return llama4_parameter_count(llama4_preset(name)); };
  return f;
}

// Llama4ForConditionalGeneration's directories: the language model's
// tensors under language_model.; the vision tower's and projector's are
// not read. A model loaded from one is a llama4_text model from then on.
FamilySpec llama4_family() {
  FamilySpec f = llama4_spec("llama4", llama4_config_from_hf);
  f.hf_keys = [](const std::string& fqn) { return std::vector<std::string>{"language_model." + fqn, fqn}; };
  f.ignored_hf_tensor = [](const std::string& key) {
    return key.rfind("vision_model.", 0) == 0 || key.rfind("multi_modal_projector.", 0) == 0 ||
           key == "language_model.lm_head.weight";
  };
  f.partial_load_note =
      "is Llama4ForConditionalGeneration: its language model is trained; the vision tower and projector "
      "(vision_model., multi_modal_projector.) are not read, and --export-hf writes Llama4ForCausalLM";
  return f;
}

}  // namespace fsdp::models
