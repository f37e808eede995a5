#include "fsdp/models/llama/config.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/common/suggest.h"
#include "fsdp/models/hf/config_reader.h"

namespace fsdp::models {

namespace {
LlamaConfig llama32(int64_t hidden, int64_t layers, int64_t heads) {
  LlamaConfig c{128256, hidden, 8192, layers, heads, 8, 131072};
  c.tie_word_embeddings = true;
  c.rope_scaling = {"llama3", 32.0, 1.0, 4.0, 8192};
  return c;
}

// Llama 2: SentencePiece's 32000-token vocabulary, theta 10000, an untied
// head; grouped keys and values only at 70B.
LlamaConfig llama2(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads, int64_t kv_heads) {
  LlamaConfig c{32000, hidden, intermediate, layers, heads, kv_heads, 4096};
  c.rope_theta = 10000.0;
  return c;
}

const std::map<std::string, LlamaConfig>& presets() {
  static const std::map<std::string, LlamaConfig> p = [] {
    std::map<std::string, LlamaConfig> m = {
        // (vocab, hidden, intermediate, layers, heads, kv heads, positions)
        {"llama-tiny", {512, 64, 176, 2, 4, 2, 128}},
        // gpt2-d6's size in Llama's form, for benchmarks and memory validation on a CPU.
        {"llama-d6", {32000, 384, 1024, 6, 6, 2, 1024}},
        {"llama3-1b", {128256, 2048, 8192, 16, 32, 8, 8192}},
        {"llama3-3b", {128256, 3072, 8192, 28, 24, 8, 8192}},
        {"llama3-8b", {128256, 4096, 14336, 32, 32, 8, 8192}},
    };
    // Llama 3.2's form (tied head, grouped keys and values) at 768 wide:
    // wide enough that matmuls dominate a CPU step; for benchmarks.
    LlamaConfig w768{32000, 768, 2048, 6, 12, 4, 1024};
    w768.tie_word_embeddings = true;
    m["llama-w768"] = w768;
    m["llama3.2-1b"] = llama32(2048, 16, 32);
    m["llama3.2-3b"] = llama32(3072, 28, 24);
    LlamaConfig l31{128256, 4096, 14336, 32, 32, 8, 131072};
    l31.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8192};
    m["llama3.1-8b"] = l31;
    m["llama2-tiny"] = llama2(64, 176, 2, 4, 4);  // tests, and Llama 2's tokenizer on small machines
    m["llama2-7b"] = llama2(4096, 11008, 32, 32, 32);
    m["llama2-13b"] = llama2(5120, 13824, 40, 40, 40);
    m["llama2-70b"] = llama2(8192, 28672, 80, 64, 8);
    return m;
  }();
  return p;
}

int64_t swiglu(int64_t hidden, int64_t inner) { return 3 * hidden * inner; }
}  // namespace

const std::vector<std::string>& llama_preset_names() {
  static const std::vector<std::string> names = {"llama-tiny",  "llama-d6", "llama-w768", "llama3-1b",   "llama3-3b",   "llama3-8b",
                                                 "llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "llama2-tiny",
                                                 "llama2-7b",   "llama2-13b",  "llama2-70b"};
  return names;
}

bool is_llama_preset(const std::string& name) { return presets().count(name) != 0; }

LlamaConfig llama_preset(const std::string& name) {
  const auto it = presets().find(name);
  FSDP_CHECK(it != presets().end(), "unknown Llama preset '", name, "': expected ", join_words(llama_preset_names()));
  return it->second;
}

namespace {
int64_t parameter_count(const LlamaConfig& c, bool active) {
  const int64_t C = c.hidden_size, hs = c.head_size();
  const int64_t attn = 2 * C * c.num_attention_heads * hs + 2 * C * c.num_key_value_heads * hs + (c.qk_norm ? 2 * hs : 0);
  int64_t total = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    int64_t mlp = swiglu(C, c.intermediate_size);
    if (c.moe.is_sparse(i)) {
      const int64_t experts = active ? c.moe.num_experts_per_tok : c.moe.num_experts;
      mlp = c.moe.num_experts * C + experts * swiglu(C, c.moe.moe_intermediate_size);
    }
    total += attn + mlp + 2 * C;
  }
  const int64_t embeddings = (c.tie_word_embeddings ? 1 : 2) * c.vocab_size * C;
  return total + embeddings + C;
}
}  // namespace

int64_t llama_parameter_count(const LlamaConfig& c) { return parameter_count(c, false); }
int64_t llama_active_parameter_count(const LlamaConfig& c) { return parameter_count(c, true); }

namespace {
// Rotary embeddings as transformers 4 writes them (`rope_theta` beside an
// optional `rope_scaling`) or as transformers 5 does (one
// `rope_parameters` object holding `rope_theta`, `rope_type` and the
// scaling's fields). Both spellings in one file must agree.
void read_rope_keys(hf::ConfigReader& r, LlamaConfig& c) {
  const auto& parameters = r.raw("rope_parameters");
  const auto& scaling_v4 = r.raw("rope_scaling");
  nlohmann::json scaling = scaling_v4;
  const char* source = parameters.is_null() ? "rope_scaling" : "rope_parameters";  // for messages
  c.rope_theta = r.get_positive_or("rope_theta", 10000.0);
  if (!parameters.is_null()) {
    FSDP_CHECK(parameters.is_object() && parameters.contains("rope_theta") && parameters.at("rope_theta").is_number(),
               r.where(), ": config.json 'rope_parameters' ", parameters.dump(),
               " is not an object with a numeric rope_theta (expected, e.g., {\"rope_type\": \"default\", "
               "\"rope_theta\": 10000.0})");
    const double theta = parameters.at("rope_theta").get<double>();
    FSDP_CHECK(!r.has("rope_theta") || c.rope_theta == theta, r.where(), ": config.json rope_theta ", c.rope_theta,
               " disagrees with rope_parameters.rope_theta ", theta);
    FSDP_CHECK(std::isfinite(theta) && theta > 0, r.where(), ": config.json rope_parameters.rope_theta is ", theta,
               " (expected a positive number)");
    c.rope_theta = theta;
    nlohmann::json rest = parameters;
    rest.erase("rope_theta");
    if (scaling_v4.is_object()) {
      for (const auto& [key, value] : scaling_v4.items()) {
        const std::string name = key == "type" ? "rope_type" : key;
        FSDP_CHECK(!rest.contains(name) || rest.at(name) == value, r.where(), ": config.json rope_scaling ",
                   scaling_v4.dump(), " disagrees with rope_parameters ", parameters.dump(), " on '", key, "'");
      }
    }
    scaling = rest;
  }
  if (scaling.is_null()) return;
  FSDP_CHECK(scaling.is_object(), r.where(), ": config.json '", source, "' is not an object");
  std::string type;
  for (const char* key : {"rope_type", "type"}) {  // transformers' spelling, then the older one
    if (!scaling.contains(key)) continue;
    FSDP_CHECK(scaling.at(key).is_string(), r.where(), ": config.json ", source, " '", key, "' is ",
               scaling.at(key).dump(), ": expected a name such as \"default\" or \"llama3\"");
    type = scaling.at(key).get<std::string>();
    break;
  }
  FSDP_CHECK(type == "llama3" || type == "default", r.where(), ": config.json ", source, " type '", type,
             "' is not implemented (expected default or llama3)");
  if (type != "llama3") return;
  try {
    const double original = scaling.at("original_max_position_embeddings").get<double>();
    c.rope_scaling = {"llama3", scaling.at("factor").get<double>(), scaling.at("low_freq_factor").get<double>(),
                      scaling.at("high_freq_factor").get<double>(),
                      original >= 1 ? static_cast<int64_t>(std::min(original, 1e12)) : 0};
  } catch (const std::exception&) {
    throw Error(r.where() + ": config.json " + source + " " + scaling.dump() +
                " lacks factor, low_freq_factor, high_freq_factor or original_max_position_embeddings");
  }
  // Equal factors (Llama 4 Scout's) leave no band to blend: every
  // wavelength is either slowed or kept.
  FSDP_CHECK(c.rope_scaling.factor > 0 && c.rope_scaling.high_freq_factor >= c.rope_scaling.low_freq_factor &&
                 c.rope_scaling.low_freq_factor > 0 && c.rope_scaling.original_max_position_embeddings >= 1,
             r.where(), ": config.json ", source, " ", scaling.dump(),
             " needs factor > 0, high_freq_factor >= low_freq_factor > 0 and original_max_position_embeddings >= 1");
}
}  // namespace

void read_decoder_keys(hf::ConfigReader& r, LlamaConfig& c) {
  c.vocab_size = r.get_size("vocab_size");
  c.hidden_size = r.get_size("hidden_size");
  c.intermediate_size = r.get_size("intermediate_size");
  c.num_hidden_layers = r.get_size("num_hidden_layers");
  c.num_attention_heads = r.get_size("num_attention_heads");
  c.num_key_value_heads = r.get_size_or("num_key_value_heads", c.num_attention_heads);
  c.max_position_embeddings = r.get_size("max_position_embeddings");
  c.rms_norm_eps = r.get_positive_or("rms_norm_eps", 1e-6);
  c.attention_dropout = r.get_probability_or("attention_dropout", 0.0);
  c.head_dim = r.get_size_or("head_dim", 0);  // 0: hidden_size / num_attention_heads
  c.tie_word_embeddings = r.get_or<bool>("tie_word_embeddings", false);
  c.pad_token_id = r.padding_row(c.vocab_size);
  FSDP_CHECK(c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0,
             r.where(), ": num_attention_heads ", c.num_attention_heads, " is not a multiple of num_key_value_heads ",
             c.num_key_value_heads);
  FSDP_CHECK(c.head_dim > 0 || c.hidden_size % c.num_attention_heads == 0, r.where(), ": hidden_size ", c.hidden_size,
             " is not a multiple of num_attention_heads ", c.num_attention_heads, " and there is no head_dim");
  read_rope_keys(r, c);
  r.accept_only("hidden_act", "silu", "the MLP's activation");
  r.accept_only("attention_bias", false, "biases on q/k/v/o projections");
  r.accept_only("mlp_bias", false, "biases on the MLP projections");
  // pretraining_tp > 1 splits the projections' matmuls into slices: the
  // same function, computed in pieces.
  r.ignore({"pretraining_tp"});
}

nlohmann::json decoder_keys_to_hf(const LlamaConfig& c) {
  nlohmann::json j = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_size()},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", nullptr},
      {"attention_dropout", c.attention_dropout},
      {"attention_bias", false},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"pad_token_id", c.pad_token_id ? nlohmann::json(*c.pad_token_id) : nlohmann::json(nullptr)},
      {"torch_dtype", "float32"},
  };
  if (c.rope_scaling.rope_type == "llama3") {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  }
  return j;
}

LlamaConfig llama_config_from_hf(const nlohmann::json& j, const std::string& where) {
  hf::ConfigReader r(j, where, "llama");
  LlamaConfig c;
  read_decoder_keys(r, c);
  r.finish();
  return c;
}

nlohmann::json llama_config_to_hf(const LlamaConfig& c) {
  auto j = decoder_keys_to_hf(c);
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["mlp_bias"] = false;
  return j;
}

}  // namespace fsdp::models
