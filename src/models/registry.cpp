#include "fsdp/models/registry.h"

#include <sys/stat.h>

#include <fstream>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/common/suggest.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/io/atomic_file.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/models/example_transformer.h"
#include "fsdp/models/gpt2.h"
#include "fsdp/models/llama.h"
#include "fsdp/nn/layers.h"

namespace fsdp::models {
namespace {

// The example transformer behind the CausalLM interface: its output head is
// untied (output.weight), and its final norm is applied in forward.
struct ExampleLMImpl : CausalLMImpl {
  explicit ExampleLMImpl(const ExampleTransformerConfig& c) : config(c) {
    model = register_module("model", ExampleTransformer(c));
  }
  torch::Tensor forward(torch::Tensor tokens) override { return model->hidden(tokens); }
  torch::Tensor output_weight() override { return model->output->weight; }
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (auto& b : model->blocks) out.push_back(b.ptr());
    return out;
  }
  void set_activation_checkpointing(bool enabled) override {
    FSDP_CHECK(!enabled, "the example transformer does not support activation checkpointing");
  }
  std::string family() const override { return "example"; }
  int64_t vocab_size() const override { return config.vocab_size; }
  int64_t max_seq_len() const override { return config.max_seq_len; }
  int64_t dim() const override { return config.dim; }
  int64_t n_layers() const override { return config.n_layers; }
  std::string hf_config_json() const override {
    throw Error("the example transformer has no Hugging Face equivalent to export to");
  }
  ExampleTransformerConfig config;
  ExampleTransformer model{nullptr};
};

template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& where) {
  FSDP_CHECK(j.contains(key), where, ": config.json has no '", key, "'");
  try {
    return j.at(key).get<T>();
  } catch (const std::exception&) {
    throw Error(where + ": config.json field '" + key + "' has the wrong type (" + j.at(key).dump() + ")");
  }
}

template <typename T>
T field_or(const nlohmann::json& j, const char* key, T fallback, const std::string& where) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  return field<T>(j, key, where);
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"gpt2-tiny", "gpt2-mini", "gpt2-d6", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl",
          "llama-tiny", "llama3-1b", "llama3-3b", "llama3-8b", "example"};
}

std::string preset_help() {
  std::string out;
  for (const auto& name : preset_names()) {
    int64_t vocab = ExampleTransformerConfig{}.vocab_size;
    if (is_gpt2_preset(name)) vocab = gpt2_preset(name).vocab_size;
    if (is_llama_preset(name)) vocab = llama_preset(name).vocab_size;
    out += (out.empty() ? "" : ", ") + name + " (vocabulary " + std::to_string(vocab) + ")";
  }
  return out;
}

CausalLM build_preset(const std::string& name, double dropout) {
  if (is_gpt2_preset(name)) {
    auto c = gpt2_preset(name);
    c.embd_pdrop = c.attn_pdrop = c.resid_pdrop = dropout;
    return std::make_shared<GPT2LMHeadModelImpl>(c);
  }
  if (is_llama_preset(name)) {
    auto c = llama_preset(name);
    c.attention_dropout = dropout;
    return std::make_shared<LlamaForCausalLMImpl>(c);
  }
  if (name == "example") {
    ExampleTransformerConfig c;
    c.dropout = dropout;
    return std::make_shared<ExampleLMImpl>(c);
  }
  const auto names = preset_names();
  throw Error("unknown model '" + name + "'" + did_you_mean(name, names) + "; presets: " + join_words(names));
}

CausalLM build_from_hf_config(const nlohmann::json& j, const std::string& where) {
  const auto type = field_or<std::string>(j, "model_type", "", where);
  if (type == "gpt2") {
    GPT2Config c;
    c.vocab_size = field<int64_t>(j, "vocab_size", where);
    c.n_positions = field<int64_t>(j, "n_positions", where);
    c.n_embd = field<int64_t>(j, "n_embd", where);
    c.n_layer = field<int64_t>(j, "n_layer", where);
    c.n_head = field<int64_t>(j, "n_head", where);
    c.layer_norm_epsilon = field_or<double>(j, "layer_norm_epsilon", 1e-5, where);
    c.embd_pdrop = field_or<double>(j, "embd_pdrop", 0.1, where);
    c.attn_pdrop = field_or<double>(j, "attn_pdrop", 0.1, where);
    c.resid_pdrop = field_or<double>(j, "resid_pdrop", 0.1, where);
    return std::make_shared<GPT2LMHeadModelImpl>(c);
  }
  if (type == "llama") {
    LlamaConfig c;
    c.vocab_size = field<int64_t>(j, "vocab_size", where);
    c.hidden_size = field<int64_t>(j, "hidden_size", where);
    c.intermediate_size = field<int64_t>(j, "intermediate_size", where);
    c.num_hidden_layers = field<int64_t>(j, "num_hidden_layers", where);
    c.num_attention_heads = field<int64_t>(j, "num_attention_heads", where);
    c.num_key_value_heads = field_or<int64_t>(j, "num_key_value_heads", c.num_attention_heads, where);
    c.max_position_embeddings = field<int64_t>(j, "max_position_embeddings", where);
    c.rms_norm_eps = field_or<double>(j, "rms_norm_eps", 1e-6, where);
    c.rope_theta = field_or<double>(j, "rope_theta", 10000.0, where);
    c.attention_dropout = field_or<double>(j, "attention_dropout", 0.0, where);
    FSDP_CHECK(!field_or<bool>(j, "tie_word_embeddings", false, where), where,
               ": tied Llama embeddings are not supported (tie_word_embeddings is true)");
    return std::make_shared<LlamaForCausalLMImpl>(c);
  }
  throw Error(where + ": model_type '" + type + "' is not supported (expected gpt2 or llama)");
}

std::string hf_key(const std::string& fqn) { return fqn; }

HfWeights::HfWeights(const std::string& dir) : config_path_(dir + "/config.json") {
  FSDP_CHECK(is_dir(dir), "--init-from '", dir, "' is not a directory (expected a Hugging Face model directory)");
  file_ = std::make_unique<io::SafetensorsFile>(dir + "/model.safetensors");
}

HfWeights::~HfWeights() = default;

std::string HfWeights::key_for(const std::string& fqn) const {
  // Checkpoints saved from GPT2Model carry no "transformer." prefix.
  std::string key = hf_key(fqn);
  if (file_->find(key) == nullptr && key.rfind("transformer.", 0) == 0 && file_->find(key.substr(12)) != nullptr) {
    key = key.substr(12);
  }
  return key;
}

void HfWeights::validate(torch::nn::Module& model) const {
  std::set<std::string> used;
  std::set<const void*> seen;
  for (const auto& item : model.named_parameters()) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    const std::string key = key_for(item.key());
    const auto* entry = file_->find(key);
    FSDP_CHECK(entry != nullptr, "'", file_->path(), "' has no tensor '", key, "', which the architecture in ",
               config_path_, " needs");
    FSDP_CHECK(entry->shape == item.value().sizes().vec(), "'", file_->path(), "': tensor '", key, "' has shape ",
               c10::IntArrayRef(entry->shape), " but ", config_path_, " implies ", item.value().sizes());
    used.insert(key);
  }
  for (const auto& e : file_->entries()) {
    if (used.count(e.name) != 0) continue;
    const bool known_extra = e.name.find("attn.bias") != std::string::npos ||
                             e.name.find("attn.masked_bias") != std::string::npos || e.name == "lm_head.weight" ||
                             e.name.find("rotary_emb.inv_freq") != std::string::npos;
    FSDP_CHECK(known_extra, "'", file_->path(), "' holds tensor '", e.name, "', which the architecture in ", config_path_,
               " does not have");
  }
}

void HfWeights::fill(const std::string& fqn, torch::Tensor& full) const {
  full.copy_(file_->view(key_for(fqn)));
}

CausalLM build_from_hf_dir(const std::string& dir, bool deferred) {
  FSDP_CHECK(is_dir(dir), "--init-from '", dir, "' is not a directory (expected a Hugging Face model directory)");
  const std::string config_path = dir + "/config.json";
  std::ifstream in(config_path);
  FSDP_CHECK(in.good(), "cannot read '", config_path, "'");
  nlohmann::json config;
  try {
    in >> config;
  } catch (const std::exception& e) {
    throw Error("'" + config_path + "' is not valid JSON (" + e.what() + ")");
  }
  std::optional<nn::DeferredInit> guard;
  if (deferred) guard.emplace();
  return build_from_hf_config(config, config_path);
}

CausalLM load_hf_pretrained(const std::string& dir) {
  CausalLM model = build_from_hf_dir(dir, /*deferred=*/false);
  HfWeights weights(dir);
  weights.validate(*model);
  torch::NoGradGuard no_grad;
  std::set<const void*> seen;
  for (const auto& item : model->named_parameters()) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    torch::Tensor value = item.value();
    weights.fill(item.key(), value);
  }
  return model;
}

void save_hf_pretrained(CausalLMImpl& model, const std::vector<std::pair<std::string, torch::Tensor>>& full_params,
                        const std::string& dir) {
  ::mkdir(dir.c_str(), 0755);
  FSDP_CHECK(is_dir(dir), "cannot create directory '", dir, "'");
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& [name, value] : full_params) tensors.emplace_back(hf_key(name), value);
  io::write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  io::write_file_atomically(dir + "/config.json", model.hf_config_json() + "\n");
}

}  // namespace fsdp::models
