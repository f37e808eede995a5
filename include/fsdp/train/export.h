#pragma once
// The end of a run: the trained model written as a Hugging Face directory
// (--export-hf) with its companions (token ids, generation config, chat
// template, and the tokenizer when it fits the model), so `fsdp generate
// --from`, AutoTokenizer and AutoModelForCausalLM find a complete directory.

#include <string>

#include "fsdp/distributed/process_group.h"
#include "fsdp/models/causal_lm.h"
#include "fsdp/train/config.h"
#include "fsdp/train/hf_companions.h"
#include "fsdp/train/telemetry.h"

namespace fsdp::train {

// Collective (gathers each parameter); rank 0 writes the weights and the
// companions (hf_companions.h) from `sources`. With LoRA (lora.rank > 0)
// the weights are a PEFT adapter directory, or under export.merge_lora the
// model with its adapters folded in.
void export_trained_model(models::CausalLMImpl& model, const TrainConfig& config,
                          const CompanionSources& sources, dist::World& world, RunLog& log);

}  // namespace fsdp::train
