#pragma once
// The decoder shared by the Llama and Qwen3 families (RMSNorm, rotary
// positions, grouped-query attention, SwiGLU), its options, presets and
// Hugging Face config.json (LlamaForCausalLM): everything that needs no
// LibTorch. Qwen3 is this decoder with per-head q/k norms and an explicit
// head size; Qwen3-MoE adds Mixture-of-Experts blocks (qwen3/config.h).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "fsdp/models/moe/config.h"

namespace fsdp::models {

namespace hf {
class ConfigReader;
}

// Llama 3.1's rope_scaling (rope_type "llama3"): low frequencies divided by
// `factor`, high ones kept, a smooth blend between.
struct RopeScaling {
  std::string rope_type;  // "" (none) or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct LlamaConfig {
  int64_t vocab_size = 128256;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 14336;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 8;
  int64_t max_position_embeddings = 8192;
  double rms_norm_eps = 1e-5;
  double rope_theta = 500000.0;
  double attention_dropout = 0.0;
  int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  bool tie_word_embeddings = false;
  std::optional<int64_t> pad_token_id;  // the embedding's padding row (transformers' padding_idx); none by default
  bool qk_norm = false;  // Qwen3: RMSNorm over each query and key head
  RopeScaling rope_scaling;
  MoEConfig moe;  // Qwen3-MoE; Llama 4's routed experts
  std::string family = "llama";  // llama, mistral, qwen3, qwen3_moe or llama4_text: which config.json it writes

  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
};

// llama-tiny (tests), llama-d6 and llama-w768 (benchmarks and memory
// validation on a CPU; llama-w768 in Llama 3.2's form, tied), llama3-1b, llama3-3b, llama3-8b (Llama 3 shapes with
// untied heads), llama3.2-1b, llama3.2-3b (tied, rope-scaled as published),
// llama3.1-8b (rope-scaled); llama2-tiny, llama2-7b, llama2-13b, llama2-70b
// (Llama 2: 32000 tokens, theta 10000, grouped key/value heads only at 70B).
const std::vector<std::string>& llama_preset_names();
LlamaConfig llama_preset(const std::string& name);
bool is_llama_preset(const std::string& name);

// Parameters from the configuration alone (no allocation), tied ones once;
// active: those one token uses (its top-k experts, not all of them).
int64_t llama_parameter_count(const LlamaConfig& config);
int64_t llama_active_parameter_count(const LlamaConfig& config);

// config.json <-> LlamaConfig for model_type llama.
LlamaConfig llama_config_from_hf(const nlohmann::json& config, const std::string& where);
nlohmann::json llama_config_to_hf(const LlamaConfig& config);

// The keys Llama and Qwen3 share, read into `c` (used by both adapters).
void read_decoder_keys(hf::ConfigReader& reader, LlamaConfig& c);
nlohmann::json decoder_keys_to_hf(const LlamaConfig& c);

}  // namespace fsdp::models
