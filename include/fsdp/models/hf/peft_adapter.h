#pragma once
// LoRA adapters written as PEFT's save_pretrained writes them, so that
// `PeftModel.from_pretrained(base, DIR)` (and transformers' load_adapter)
// puts them on the base model: adapter_config.json and
// adapter_model.safetensors, each tensor named
// base_model.model.<the base layer's Hugging Face name>.lora_{A,B}.weight.

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/models/causal_lm.h"

namespace fsdp::models {

struct PeftAdapterInfo {
  int64_t rank = 0;
  double alpha = 0;
  double dropout = 0;
  std::string base_model;  // adapter_config's base_model_name_or_path (the --init-from directory)
  // Writes the files that go beside the adapter (the tokenizer) into the
  // directory it is given, before it is published.
  std::function<void(const std::string&)> companions;
};

// Writes DIR (staged beside it, then published whole) from the model's full
// parameters: the adapters ("<layer>.lora_A.weight"), in fp32; the rest is
// the base's and is not written. target_modules lists the adapted layers'
// Hugging Face names. Throws when the parameters hold no adapter.
void save_peft_adapter(const CausalLMImpl& model, const std::vector<std::pair<std::string, torch::Tensor>>& full_params,
                       const PeftAdapterInfo& info, const std::string& dir);

// Copies a PEFT LoRA adapter directory's weights into `model`'s adapters
// (nn/lora.h's add_lora made them; unsharded, before fully_shard): to go
// on training an adapter. Throws naming the directory when its r or
// lora_alpha differ from `rank` and `alpha`, it adapts other layers than
// the model's, a tensor's shape differs, or it is not a LoRA adapter.
void load_peft_adapter(CausalLMImpl& model, const std::string& dir, int64_t rank, double alpha);

// A PEFT LoRA adapter directory put on `model` (a plain model, as
// load_hf_pretrained returns it): adapters added on the layers its
// adapter_config.json's target_modules name (full names or last parts, or
// "all-linear"), at its r and lora_alpha, then its weights loaded as
// load_peft_adapter loads them; the base is frozen. For inference
// (`fsdp generate --adapter`). Throws naming the directory and what is
// wrong: not a LoRA adapter, a target pattern, layers the model lacks.
void apply_peft_adapter(CausalLMImpl& model, const std::string& dir);

// Whether NAME is a file save_peft_adapter writes.
bool is_peft_adapter_file(const std::string& name);

}  // namespace fsdp::models
