#pragma once
// Llama 4's text model (Hugging Face's Llama4ForCausalLM, model_type
// llama4_text, and the language model inside Llama4ForConditionalGeneration,
// model_type llama4): the Llama decoder's sizes (llama/config.h) plus what
// Llama 4 changes. Presets and config.json, no LibTorch.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "fsdp/models/llama/config.h"

namespace fsdp::models {

struct Llama4Config {
  // vocab_size, hidden_size, heads, head_dim, positions, rms_norm_eps, rope
  // and the tied head as Llama's; intermediate_size is the width of each
  // expert and of the shared expert (Hugging Face's naming), and
  // text.moe the routed experts (num_local_experts, num_experts_per_tok,
  // moe_layers, router_aux_loss_coef; moe_intermediate_size equals
  // intermediate_size).
  LlamaConfig text;
  int64_t intermediate_size_mlp = 16384;  // the dense layers' SwiGLU width
  std::vector<int64_t> no_rope_layers;  // one per layer: 1 rotates q/k, 0 is a NoPE layer
  std::vector<bool> chunked_attention;  // one per layer: local attention within chunks
  int64_t attention_chunk_size = 8192;  // 0: no chunked layers
  bool use_qk_norm = true;              // L2 norm of q and k after the rotation, RoPE layers only
  // NoPE layers scale each query by log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1.
  bool attn_temperature_tuning = true;
  double floor_scale = 8192;
  double attn_scale = 0.1;
  // Hugging Face's Llama4ForCausalLM returns router logits but adds no
  // load-balancing loss; here it is added, times text.moe's
  // router_aux_loss_coef, when output_router_logits asks for the router's
  // outputs (Mixtral's rule).
  bool output_router_logits = false;

  bool is_moe(int64_t layer) const { return text.moe.is_sparse(layer); }
  bool uses_rope(int64_t layer) const;
  bool is_chunked(int64_t layer) const;
};

// llama4-tiny (tests: every layer kind), llama4-scout (Llama-4-Scout-17B-16E),
// llama4-maverick (Llama-4-Maverick-17B-128E): the published text models.
const std::vector<std::string>& llama4_preset_names();
Llama4Config llama4_preset(const std::string& name);

// Parameters from the configuration alone; active: those one token uses
// (the shared expert and its top-k routed experts).
int64_t llama4_parameter_count(const Llama4Config& config);
int64_t llama4_active_parameter_count(const Llama4Config& config);

// config.json -> Llama4Config: model_type llama4_text, or llama4 (its
// text_config; the vision tower is not read).
Llama4Config llama4_text_config_from_hf(const nlohmann::json& config, const std::string& where);
Llama4Config llama4_config_from_hf(const nlohmann::json& config, const std::string& where);
// Always llama4_text (Llama4ForCausalLM): what fsdp.cpp trains.
nlohmann::json llama4_config_to_hf(const Llama4Config& config);

}  // namespace fsdp::models
