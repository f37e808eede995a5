// Qwen3 and Qwen3-MoE: presets and Hugging Face adapters over the shared
// decoder (llama/model.h), which implements q/k norms and sparse blocks.

#include "fsdp/models/llama/family.h"
#include "fsdp/models/qwen3/config.h"

namespace fsdp::models {

FamilySpec qwen3_family() {
  return llama_decoder_family({"qwen3", qwen3_preset_names(), qwen3_preset, qwen3_config_from_hf, qwen3_config_to_hf});
}

FamilySpec qwen3_moe_family() {
  return llama_decoder_family(
      {"qwen3_moe", qwen3_moe_preset_names(), qwen3_preset, qwen3_moe_config_from_hf, qwen3_config_to_hf});
}

}  // namespace fsdp::models
