#include "fsdp/models/gpt2/config.h"

#include <map>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/common/suggest.h"
#include "fsdp/models/hf/config_reader.h"

namespace fsdp::models {

namespace {
const std::map<std::string, GPT2Config>& presets() {
  // (vocab, positions, embd, layers, heads)
  static const std::map<std::string, GPT2Config> p = {
      {"gpt2-tiny", {512, 64, 32, 2, 2}},
      {"gpt2-mini", {50257, 256, 128, 4, 4}},
      {"gpt2-d6", {50257, 1024, 384, 6, 6}},
      {"gpt2", {50257, 1024, 768, 12, 12}},
      {"gpt2-medium", {50257, 1024, 1024, 24, 16}},
      {"gpt2-large", {50257, 1024, 1280, 36, 20}},
      {"gpt2-xl", {50257, 1024, 1600, 48, 25}},
  };
  return p;
}
}  // namespace

const std::vector<std::string>& gpt2_preset_names() {
  static const std::vector<std::string> names = {"gpt2-tiny",   "gpt2-mini",  "gpt2-d6", "gpt2",
                                                 "gpt2-medium", "gpt2-large", "gpt2-xl"};
  return names;
}

bool is_gpt2_preset(const std::string& name) { return presets().count(name) != 0; }

GPT2Config gpt2_preset(const std::string& name) {
  const auto it = presets().find(name);
  FSDP_CHECK(it != presets().end(), "unknown GPT-2 preset '", name, "': expected ", join_words(gpt2_preset_names()));
  return it->second;
}

int64_t gpt2_parameter_count(const GPT2Config& c) {
  const int64_t C = c.n_embd;
  const int64_t block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C);
  return c.vocab_size * C + c.n_positions * C + c.n_layer * block + 2 * C;
}

GPT2Config gpt2_config_from_hf(const nlohmann::json& j, const std::string& where) {
  hf::ConfigReader r(j, where, "gpt2");
  GPT2Config c;
  c.vocab_size = r.get_size("vocab_size");
  c.n_positions = r.get_size("n_positions");
  c.n_embd = r.get_size("n_embd");
  c.n_layer = r.get_size("n_layer");
  c.n_head = r.get_size("n_head");
  c.layer_norm_epsilon = r.get_positive_or("layer_norm_epsilon", 1e-5);
  c.embd_pdrop = r.get_probability_or("embd_pdrop", 0.1);
  c.attn_pdrop = r.get_probability_or("attn_pdrop", 0.1);
  c.resid_pdrop = r.get_probability_or("resid_pdrop", 0.1);
  if (const auto& inner = r.raw("n_inner"); !inner.is_null()) {
    FSDP_CHECK(inner == 4 * c.n_embd, where, ": config.json sets 'n_inner' to ", inner.dump(),
               "; GPT-2's MLP here is 4 * n_embd = ", 4 * c.n_embd, " wide");
  }
  r.accept_only("activation_function", "gelu_new", "the MLP's activation");
  r.accept_only("tie_word_embeddings", true, "GPT-2's output head is the token embedding");
  r.accept_only("scale_attn_weights", true, "attention scores divided by sqrt(head size)");
  r.accept_only("scale_attn_by_inverse_layer_idx", false, "attention scores divided by the layer index");
  r.accept_only("add_cross_attention", false, "cross-attention layers");
  // n_ctx repeats n_positions; the summary_* keys configure the heads of
  // GPT2DoubleHeadsModel, not the language model; reorder_and_upcast_attn
  // only changes the precision of fp16 attention. transformers' GPT-2
  // builds its embedding without a padding row: pad_token_id only tells
  // GPT2ForSequenceClassification where a sequence ends.
  r.ignore({"pad_token_id", "n_ctx", "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
            "summary_first_dropout", "task_specific_params", "reorder_and_upcast_attn", "predict_special_tokens",
            "n_special"});
  r.finish();
  return c;
}

nlohmann::json gpt2_config_to_hf(const GPT2Config& c) {
  return {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", c.vocab_size},
      {"n_positions", c.n_positions},
      {"n_ctx", c.n_positions},
      {"n_embd", c.n_embd},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_inner", nullptr},
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", c.layer_norm_epsilon},
      {"embd_pdrop", c.embd_pdrop},
      {"attn_pdrop", c.attn_pdrop},
      {"resid_pdrop", c.resid_pdrop},
      {"tie_word_embeddings", true},
      // GPT-2's <|endoftext|>, where the vocabulary has it (transformers
      // warns about an id outside it).
      {"bos_token_id", c.vocab_size > 50256 ? nlohmann::json(50256) : nlohmann::json(nullptr)},
      {"eos_token_id", c.vocab_size > 50256 ? nlohmann::json(50256) : nlohmann::json(nullptr)},
      {"torch_dtype", "float32"},
  };
}

}  // namespace fsdp::models
