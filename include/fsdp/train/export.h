#pragma once
// The end of a run: the trained model written as a Hugging Face directory
// (--export-hf) with its companions (token ids, generation config, chat
// template, and the tokenizer when it fits the model), so `fsdp generate
// --from`, AutoTokenizer and AutoModelForCausalLM find a complete directory.

#include <string>

#include "fsdp/distributed/process_group.h"
#include "fsdp/models/causal_lm.h"
#include "fsdp/models/hf/weights.h"
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

// Whether a checkpoint's metadata is a LoRA run's (its configuration has
// lora.rank > 0).
bool is_lora_checkpoint(const nlohmann::json& metadata);

// `fsdp ckpt export` of a LoRA run's checkpoint (one process): the base
// its run read (--init-from, refused when its weights are not the ones the
// checkpoint records), the adapters the checkpoint holds put on it, and
// written as a PEFT adapter directory, or with `merge` as the model with
// the adapters folded in (options: the dtype, shard size and companions of
// a Hugging Face export; the companions go beside an adapter too).
// Returns what was written, for the command's line.
std::string export_lora_checkpoint(const std::string& checkpoint, const std::string& out, bool merge,
                                   const models::HfExportOptions& options);

}  // namespace fsdp::train
