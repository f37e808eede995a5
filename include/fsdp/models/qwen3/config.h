#pragma once
// Qwen3 (Qwen3ForCausalLM) and Qwen3-MoE (Qwen3MoeForCausalLM): the shared
// decoder of llama/config.h with per-head q/k RMSNorm and an explicit head
// size, and for MoE, sparse blocks of routed SwiGLU experts. Presets and
// config.json, no LibTorch.

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "fsdp/models/llama/config.h"

namespace fsdp::models {

// qwen3-tiny, qwen3-0.6b (dense); qwen3-moe-tiny, qwen3-30b-a3b (MoE).
const std::vector<std::string>& qwen3_preset_names();
const std::vector<std::string>& qwen3_moe_preset_names();
LlamaConfig qwen3_preset(const std::string& name);  // either family's presets

// config.json <-> LlamaConfig for model_type qwen3 and qwen3_moe.
LlamaConfig qwen3_config_from_hf(const nlohmann::json& config, const std::string& where);
LlamaConfig qwen3_moe_config_from_hf(const nlohmann::json& config, const std::string& where);
nlohmann::json qwen3_config_to_hf(const LlamaConfig& config);  // qwen3 or qwen3_moe by config.family

}  // namespace fsdp::models
