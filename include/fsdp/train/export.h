#pragma once
// The end of a run: the trained model written as a Hugging Face directory
// (--export-hf) with its companions (token ids, generation config, chat
// template, and the tokenizer when it fits the model), so `fsdp generate
// --from`, AutoTokenizer and AutoModelForCausalLM find a complete directory.

#include <string>

#include "fsdp/dist/process_group.h"
#include "fsdp/models/causal_lm.h"
#include "fsdp/train/config.h"
#include "fsdp/train/hf_companions.h"
#include "fsdp/train/telemetry.h"

namespace fsdp::train {

// Collective (gathers each parameter); rank 0 writes the weights and the
// companions (hf_companions.h) from `sources`.
void export_trained_model(models::CausalLMImpl& model, const TrainConfig::HfExport& config,
                          const CompanionSources& sources, dist::World& world, RunLog& log);

}  // namespace fsdp::train
