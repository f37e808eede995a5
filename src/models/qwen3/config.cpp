#include "fsdp/models/qwen3/config.h"

#include <map>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/common/suggest.h"
#include "fsdp/models/hf/config_reader.h"

namespace fsdp::models {

namespace {
LlamaConfig qwen3(int64_t vocab, int64_t hidden, int64_t inner, int64_t layers, int64_t heads, int64_t kv,
                  int64_t head_dim, int64_t positions, bool tied) {
  LlamaConfig c{vocab, hidden, inner, layers, heads, kv, positions};
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.head_dim = head_dim;
  c.qk_norm = true;
  c.tie_word_embeddings = tied;
  c.family = "qwen3";
  return c;
}

LlamaConfig qwen3_moe(LlamaConfig c, MoEConfig moe) {
  c.moe = std::move(moe);
  c.family = "qwen3_moe";
  return c;
}

const std::map<std::string, LlamaConfig>& presets() {
  static const std::map<std::string, LlamaConfig> p = {
      // head_dim 32 != hidden / heads = 16, as in the real models.
      {"qwen3-tiny", qwen3(512, 64, 176, 2, 4, 2, 32, 128, true)},
      {"qwen3-0.6b", qwen3(151936, 1024, 3072, 28, 16, 8, 128, 40960, true)},
      // (experts, top-k, expert width, norm_topk_prob, sparse step, dense layers, aux coefficient)
      {"qwen3-moe-tiny", qwen3_moe(qwen3(512, 64, 128, 3, 4, 2, 16, 128, false), {8, 2, 32, true, 1, {1}, 0.01})},
      {"qwen3-30b-a3b",
       qwen3_moe(qwen3(151936, 2048, 6144, 48, 32, 4, 128, 40960, false), {128, 8, 768, true, 1, {}, 0.001})},
  };
  return p;
}

void read_qwen3_keys(hf::ConfigReader& r, LlamaConfig& c) {
  read_decoder_keys(r, c);
  c.qk_norm = true;
  r.accept_only("use_sliding_window", false, "sliding-window attention");
  // Read only with use_sliding_window.
  r.ignore({"sliding_window", "max_window_layers"});
  if (const auto& types = r.raw("layer_types"); types.is_array()) {
    for (const auto& t : types) {
      FSDP_CHECK(t == "full_attention", r.where(), ": config.json layer_types holds ", t.dump(),
                 ", which is not implemented (expected full_attention for every layer)");
    }
  }
}
}  // namespace

const std::vector<std::string>& qwen3_preset_names() {
  static const std::vector<std::string> names = {"qwen3-tiny", "qwen3-0.6b"};
  return names;
}

const std::vector<std::string>& qwen3_moe_preset_names() {
  static const std::vector<std::string> names = {"qwen3-moe-tiny", "qwen3-30b-a3b"};
  return names;
}

LlamaConfig qwen3_preset(const std::string& name) {
  const auto it = presets().find(name);
  FSDP_CHECK(it != presets().end(), "unknown Qwen3 preset '", name, "'");
  return it->second;
}

LlamaConfig qwen3_config_from_hf(const nlohmann::json& j, const std::string& where) {
  hf::ConfigReader r(j, where, "qwen3");
  LlamaConfig c;
  read_qwen3_keys(r, c);
  c.family = "qwen3";
  r.finish();
  return c;
}

LlamaConfig qwen3_moe_config_from_hf(const nlohmann::json& j, const std::string& where) {
  hf::ConfigReader r(j, where, "qwen3_moe");
  LlamaConfig c;
  read_qwen3_keys(r, c);
  c.family = "qwen3_moe";
  auto& m = c.moe;
  // transformers 5 writes num_local_experts, 4 num_experts.
  const bool v5_name = r.has("num_local_experts");
  FSDP_CHECK(!(v5_name && r.has("num_experts")) || r.raw("num_experts") == r.raw("num_local_experts"), where,
             ": config.json num_experts and num_local_experts disagree");
  m.num_experts = v5_name ? r.get_size("num_local_experts") : r.get_size("num_experts");
  r.ignore({"num_experts", "num_local_experts"});
  m.num_experts_per_tok = r.get_size("num_experts_per_tok");
  m.moe_intermediate_size = r.get_size("moe_intermediate_size");
  m.norm_topk_prob = r.get_or<bool>("norm_topk_prob", false);
  m.decoder_sparse_step = r.get_or<int64_t>("decoder_sparse_step", 1);
  m.mlp_only_layers = r.get_or<std::vector<int64_t>>("mlp_only_layers", {});
  m.router_aux_loss_coef = r.get_or<double>("router_aux_loss_coef", 0.001);
  FSDP_CHECK(m.num_experts > 0 && m.num_experts_per_tok > 0 && m.num_experts_per_tok <= m.num_experts, where,
             ": config.json num_experts_per_tok ", m.num_experts_per_tok, " must be in 1..num_experts (",
             m.num_experts, ")");
  FSDP_CHECK(m.decoder_sparse_step > 0, where, ": config.json decoder_sparse_step must be positive");
  // transformers adds router_aux_loss_coef times the load-balancing loss to
  // the training loss only with output_router_logits (default false).
  m.output_router_logits = r.get_or<bool>("output_router_logits", false);
  r.finish();
  return c;
}

nlohmann::json qwen3_config_to_hf(const LlamaConfig& c) {
  auto j = decoder_keys_to_hf(c);
  j["use_sliding_window"] = false;
  if (c.family == "qwen3_moe") {
    j["architectures"] = {"Qwen3MoeForCausalLM"};
    j["model_type"] = "qwen3_moe";
    j["num_experts"] = c.moe.num_experts;
    j["num_experts_per_tok"] = c.moe.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe.moe_intermediate_size;
    j["norm_topk_prob"] = c.moe.norm_topk_prob;
    j["decoder_sparse_step"] = c.moe.decoder_sparse_step;
    j["mlp_only_layers"] = c.moe.mlp_only_layers;
    j["router_aux_loss_coef"] = c.moe.router_aux_loss_coef;
    j["output_router_logits"] = c.moe.output_router_logits;
  } else {
    j["architectures"] = {"Qwen3ForCausalLM"};
    j["model_type"] = "qwen3";
  }
  return j;
}

}  // namespace fsdp::models
