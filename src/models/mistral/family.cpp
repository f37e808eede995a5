// Mistral (MistralForCausalLM): the Llama decoder under another name, with
// a sliding attention window that fsdp.cpp does not implement. A window
// at least as long as the model's positions never cuts anything (Mistral
// 7B v0.2 and later write none) and is accepted; a shorter one is refused
// by name. The whole family: presets, config.json both ways, the registry
// entry. Everything else is the shared decoder's (llama/model.h).

#include <map>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/common/suggest.h"
#include "fsdp/models/hf/config_reader.h"
#include "fsdp/models/llama/family.h"

namespace fsdp::models {

namespace {
LlamaConfig mistral(int64_t vocab, int64_t hidden, int64_t ffn, int64_t layers, int64_t heads, int64_t kv_heads,
                    int64_t positions, double theta) {
  LlamaConfig c{vocab, hidden, ffn, layers, heads, kv_heads, positions};
  c.rope_theta = theta;
  c.family = "mistral";
  return c;
}

const std::map<std::string, LlamaConfig>& presets() {
  static const std::map<std::string, LlamaConfig> p = {
      {"mistral-tiny", mistral(512, 64, 176, 2, 4, 2, 128, 1e6)},  // tests
      // mistralai/Mistral-7B-v0.3.
      {"mistral-7b", mistral(32768, 4096, 14336, 32, 32, 8, 32768, 1e6)},
  };
  return p;
}

std::vector<std::string> mistral_preset_names() { return {"mistral-tiny", "mistral-7b"}; }

LlamaConfig preset(const std::string& name) {
  const auto it = presets().find(name);
  FSDP_CHECK(it != presets().end(), "unknown Mistral preset '", name, "': expected ",
             join_words(mistral_preset_names()));
  return it->second;
}

LlamaConfig config_from_hf(const nlohmann::json& j, const std::string& where) {
  hf::ConfigReader r(j, where, "mistral");
  LlamaConfig c;
  read_decoder_keys(r, c);
  c.family = "mistral";
  // Absent, transformers' MistralConfig applies its default window, 4096.
  const bool given = j.contains("sliding_window");
  const nlohmann::json window = given ? r.raw("sliding_window") : nlohmann::json(4096);
  FSDP_CHECK(window.is_null() || window.is_number_integer(), where, ": config.json sliding_window is ", window.dump(),
             " (expected null or a number of positions)");
  FSDP_CHECK(window.is_null() || window.get<int64_t>() >= c.max_position_embeddings, where,
             ": config.json sliding_window ", window.dump(), given ? "" : " (transformers' default)",
             " is shorter than max_position_embeddings ", c.max_position_embeddings,
             ": sliding-window attention is not implemented (expected null or at least the model's positions)");
  r.finish();
  return c;
}

nlohmann::json config_to_hf(const LlamaConfig& c) {
  auto j = decoder_keys_to_hf(c);
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  j["sliding_window"] = nullptr;
  return j;
}
}  // namespace

FamilySpec mistral_family() {
  return llama_decoder_family({"mistral", mistral_preset_names(), preset, config_from_hf, config_to_hf});
}

}  // namespace fsdp::models
