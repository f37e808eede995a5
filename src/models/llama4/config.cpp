#include "fsdp/models/llama4/config.h"

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/common/suggest.h"
#include "fsdp/models/hf/config_reader.h"

namespace fsdp::models {

namespace {

// Hugging Face's defaults for the per-layer lists a config.json may leave
// out: a NoPE layer every `no_rope_interval`-th, experts every
// `moe_step`-th, and chunked attention on the RoPE layers.
// An explicit empty moe_layers means no MoE layers (transformers tests it
// against None); an empty no_rope_layers means the default (it tests
// truthiness).
void default_layer_lists(Llama4Config& c, int64_t no_rope_interval, int64_t moe_step, bool moe_layers_given) {
  const int64_t layers = c.text.num_hidden_layers;
  if (c.no_rope_layers.empty()) {
    for (int64_t i = 0; i < layers; ++i) c.no_rope_layers.push_back((i + 1) % no_rope_interval != 0 ? 1 : 0);
  }
  if (!moe_layers_given) {
    c.text.moe.decoder_sparse_step = moe_step;
    c.text.moe.mlp_only_layers.clear();
  }
  if (c.chunked_attention.empty()) {
    for (int64_t i = 0; i < layers; ++i) c.chunked_attention.push_back(c.no_rope_layers[static_cast<size_t>(i)] != 0);
  }
}

// Sizes, then Llama 4's choices; `published` shapes keep Hugging Face's defaults.
Llama4Config shape(int64_t vocab, int64_t hidden, int64_t expert_width, int64_t mlp_width, int64_t layers,
                   int64_t heads, int64_t kv_heads, int64_t positions, int64_t experts, int64_t top_k, int64_t moe_step,
                   bool qk_norm) {
  Llama4Config c;
  c.text = LlamaConfig{vocab, hidden, expert_width, layers, heads, kv_heads, positions};
  c.text.head_dim = hidden / heads;
  c.text.rope_theta = 500000.0;
  c.text.family = "llama4_text";
  c.intermediate_size_mlp = mlp_width;
  c.text.moe = {experts, top_k, expert_width, /*norm_topk_prob=*/false};
  c.text.moe.router_aux_loss_coef = 0.001;
  c.use_qk_norm = qk_norm;
  default_layer_lists(c, 4, moe_step, false);
  return c;
}

const std::map<std::string, Llama4Config>& presets() {
  static const std::map<std::string, Llama4Config> p = [] {
    std::map<std::string, Llama4Config> m;
    // Every kind of layer in four: dense and MoE, RoPE (chunked, q/k
    // normalised) and NoPE (temperature-tuned), with chunks and a
    // temperature floor small enough that 16-token sequences cross them.
    Llama4Config tiny = shape(512, 64, 32, 128, 4, 4, 2, 128, 4, 2, 2, true);
    tiny.text.head_dim = 16;
    tiny.no_rope_layers = {1, 0, 1, 0};
    tiny.chunked_attention = {true, false, true, false};
    tiny.attention_chunk_size = 8;
    tiny.floor_scale = 4;
    tiny.text.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 16};
    tiny.output_router_logits = true;
    tiny.text.moe.router_aux_loss_coef = 0.01;
    m["llama4-tiny"] = tiny;
    // meta-llama/Llama-4-Scout-17B-16E's text_config.
    Llama4Config scout = shape(202048, 5120, 8192, 16384, 48, 40, 8, 10485760, 16, 1, 1, true);
    scout.text.rope_scaling = {"llama3", 16.0, 1.0, 1.0, 8192};
    m["llama4-scout"] = scout;
    // meta-llama/Llama-4-Maverick-17B-128E's: experts every other layer, no q/k norm.
    m["llama4-maverick"] = shape(202048, 5120, 8192, 16384, 48, 40, 8, 1048576, 128, 1, 2, false);
    return m;
  }();
  return p;
}

int64_t swiglu(int64_t hidden, int64_t inner) { return 3 * hidden * inner; }

int64_t parameter_count(const Llama4Config& c, bool active) {
  const auto& t = c.text;
  const int64_t C = t.hidden_size, hs = t.head_size();
  const int64_t attn = 2 * C * t.num_attention_heads * hs + 2 * C * t.num_key_value_heads * hs;
  int64_t total = 0;
  for (int64_t i = 0; i < t.num_hidden_layers; ++i) {
    int64_t mlp = swiglu(C, c.intermediate_size_mlp);
    if (c.is_moe(i)) {
      const int64_t experts = active ? t.moe.num_experts_per_tok : t.moe.num_experts;
      mlp = t.moe.num_experts * C + (experts + 1) * swiglu(C, t.intermediate_size);  // router, routed, shared
    }
    total += attn + mlp + 2 * C;
  }
  return total + (t.tie_word_embeddings ? 1 : 2) * t.vocab_size * C + C;
}

// A per-layer list: empty when absent, else its first `layers` entries.
std::vector<int64_t> layer_list(hf::ConfigReader& r, const char* key, int64_t layers) {
  auto values = r.get_or<std::vector<int64_t>>(key, {});
  FSDP_CHECK(values.empty() || static_cast<int64_t>(values.size()) >= layers, r.where(), ": config.json '", key,
             "' has ", values.size(), " entries for ", layers, " layers (expected one per layer)");
  values.resize(std::min<size_t>(values.size(), static_cast<size_t>(layers)));
  return values;
}
}  // namespace

bool Llama4Config::uses_rope(int64_t layer) const { return no_rope_layers.at(static_cast<size_t>(layer)) != 0; }
bool Llama4Config::is_chunked(int64_t layer) const {
  return attention_chunk_size > 0 && chunked_attention.at(static_cast<size_t>(layer));
}

const std::vector<std::string>& llama4_preset_names() {
  static const std::vector<std::string> names = {"llama4-tiny", "llama4-scout", "llama4-maverick"};
  return names;
}

Llama4Config llama4_preset(const std::string& name) {
  const auto it = presets().find(name);
  FSDP_CHECK(it != presets().end(), "unknown Llama 4 preset '", name, "': expected ",
             join_words(llama4_preset_names()));
  return it->second;
}

int64_t llama4_parameter_count(const Llama4Config& c) { return parameter_count(c, false); }
int64_t llama4_active_parameter_count(const Llama4Config& c) { return parameter_count(c, true); }

Llama4Config llama4_text_config_from_hf(const nlohmann::json& j, const std::string& where) {
  hf::ConfigReader r(j, where, "llama4_text");
  Llama4Config c;
  auto& t = c.text;
  // Llama4TextConfig's defaults where they differ from the Llama decoder's.
  const bool has_eps = r.has("rms_norm_eps"), has_head_dim = r.has("head_dim");
  const bool has_theta = r.has("rope_theta") || r.has("rope_parameters");
  read_decoder_keys(r, t);
  if (!has_eps) t.rms_norm_eps = 1e-5;
  if (!has_head_dim) t.head_dim = 128;
  if (!has_theta) t.rope_theta = 500000.0;
  t.family = "llama4_text";
  // Written by Meta's and transformers' tools; none changes the model.
  r.ignore({"for_llm_compressor", "_attn_implementation_autoset", "cache_implementation", "attn_implementation"});
  c.intermediate_size_mlp = r.get_size("intermediate_size_mlp");
  auto& moe = t.moe;
  moe.num_experts = r.get_size("num_local_experts");
  moe.num_experts_per_tok = r.get_size("num_experts_per_tok");
  moe.moe_intermediate_size = t.intermediate_size;
  moe.norm_topk_prob = false;
  FSDP_CHECK(moe.num_experts_per_tok <= moe.num_experts, where, ": config.json num_experts_per_tok ",
             moe.num_experts_per_tok, " must be at most num_local_experts (", moe.num_experts, ")");
  const int64_t layers = t.num_hidden_layers;
  // Per-layer lists are built below, bounded by get_size's limit on the
  // layer count ([Note: dimension limits]).
  const bool moe_layers_given = r.has("moe_layers");
  const auto moe_layers = r.get_or<std::vector<int64_t>>("moe_layers", {});
  for (const int64_t layer : moe_layers) {
    FSDP_CHECK(layer >= 0 && layer < layers, where, ": config.json moe_layers names layer ", layer, " of ", layers);
  }
  if (moe_layers_given) moe.set_sparse_layers(moe_layers, layers);
  const int64_t moe_step = r.get_size_or("interleave_moe_layer_step", 1);
  c.no_rope_layers = layer_list(r, "no_rope_layers", layers);
  for (const int64_t v : c.no_rope_layers) {
    FSDP_CHECK(v == 0 || v == 1, where, ": config.json no_rope_layers holds ", v,
               " (expected 1 for a RoPE layer, 0 for a NoPE layer)");
  }
  const int64_t no_rope_interval = r.get_size_or("no_rope_layer_interval", 4);
  const auto& types = r.raw("layer_types");
  FSDP_CHECK(types.is_null() || types.is_array(), where, ": config.json layer_types is ", types.dump(),
             " (expected a list, one entry per layer)");
  if (types.is_array()) {
    FSDP_CHECK(static_cast<int64_t>(types.size()) >= layers, where, ": config.json layer_types has ", types.size(),
               " entries for ", layers, " layers");
    for (int64_t i = 0; i < layers; ++i) {
      const auto& type = types[static_cast<size_t>(i)];
      FSDP_CHECK(type == "full_attention" || type == "chunked_attention", where, ": config.json layer_types holds ",
                 type.dump(), ", which is not implemented (expected full_attention or chunked_attention)");
      c.chunked_attention.push_back(type == "chunked_attention");
    }
  }
  default_layer_lists(c, no_rope_interval, moe_step, moe_layers_given);
  // Absent: transformers' default, 8192; null: no layer attends in chunks.
  if (r.has("attention_chunk_size")) {
    c.attention_chunk_size = r.get_size("attention_chunk_size");
  } else {
    c.attention_chunk_size = j.contains("attention_chunk_size") ? 0 : 8192;
    r.raw("attention_chunk_size");
  }
  c.use_qk_norm = r.get_or<bool>("use_qk_norm", true);
  // Early checkpoints wrote attn_temperature_tuning as a number (4): any nonzero value enables it.
  const auto& tuning = r.raw("attn_temperature_tuning");
  FSDP_CHECK(tuning.is_null() || tuning.is_boolean() || tuning.is_number(), where,
             ": config.json attn_temperature_tuning is ", tuning.dump(), " (expected true or false)");
  c.attn_temperature_tuning =
      tuning.is_null() || (tuning.is_boolean() ? tuning.get<bool>() : tuning.get<double>() != 0);
  c.floor_scale = r.get_or<double>("floor_scale", 8192.0);
  c.attn_scale = r.get_or<double>("attn_scale", 0.1);
  FSDP_CHECK(c.floor_scale > 0, where, ": config.json floor_scale must be positive");
  c.output_router_logits = r.get_or<bool>("output_router_logits", false);
  moe.router_aux_loss_coef = r.get_or<double>("router_aux_loss_coef", 0.001);
  r.accept_only("router_jitter_noise", 0.0, "router jitter noise");
  r.finish();
  return c;
}

Llama4Config llama4_config_from_hf(const nlohmann::json& j, const std::string& where) {
  hf::ConfigReader r(j, where, "llama4");
  const auto& text = r.raw("text_config");
  FSDP_CHECK(text.is_object(), where, ": config.json (model_type llama4) has no text_config object");
  // The language model is what is trained; the vision tower and its
  // projector are left out (their weights are skipped: family.cpp).
  // The outer pad_token_id marks padding for the multimodal model's inputs;
  // the language model's embedding takes text_config's (read below).
  r.ignore({"vision_config", "boi_token_index", "eoi_token_index", "image_token_index", "pad_token_id"});
  r.accept_only("tie_word_embeddings", false, "a head tied to the embedding");
  r.finish();
  nlohmann::json inner = text;
  if (!inner.contains("model_type")) inner["model_type"] = "llama4_text";
  return llama4_text_config_from_hf(inner, where + " text_config");
}

nlohmann::json llama4_config_to_hf(const Llama4Config& c) {
  auto j = decoder_keys_to_hf(c.text);
  j["architectures"] = {"Llama4ForCausalLM"};
  j["model_type"] = "llama4_text";
  j["intermediate_size_mlp"] = c.intermediate_size_mlp;
  j["num_local_experts"] = c.text.moe.num_experts;
  j["num_experts_per_tok"] = c.text.moe.num_experts_per_tok;
  j["moe_layers"] = c.text.moe.sparse_layers(c.text.num_hidden_layers);
  j["no_rope_layers"] = c.no_rope_layers;
  std::vector<std::string> types;
  for (const bool chunked : c.chunked_attention) types.push_back(chunked ? "chunked_attention" : "full_attention");
  j["layer_types"] = types;
  j["attention_chunk_size"] = c.attention_chunk_size > 0 ? nlohmann::json(c.attention_chunk_size) : nlohmann::json();
  j["use_qk_norm"] = c.use_qk_norm;
  j["attn_temperature_tuning"] = c.attn_temperature_tuning;
  // transformers declares floor_scale an int: a whole number is written as one.
  j["floor_scale"] = c.floor_scale == static_cast<double>(static_cast<int64_t>(c.floor_scale))
                         ? nlohmann::json(static_cast<int64_t>(c.floor_scale))
                         : nlohmann::json(c.floor_scale);
  j["attn_scale"] = c.attn_scale;
  j["output_router_logits"] = c.output_router_logits;
  j["router_aux_loss_coef"] = c.text.moe.router_aux_loss_coef;
  j["router_jitter_noise"] = 0.0;
  return j;
}

}  // namespace fsdp::models
