#pragma once
// The end of a run: the trained model written as a Hugging Face directory
// (--export-hf), with the tokenizer beside it when it fits the model, so
// `fsdp generate --from` and `AutoTokenizer` find a complete directory.

#include <string>

#include "fsdp/data/tokenizer.h"
#include "fsdp/dist/process_group.h"
#include "fsdp/models/causal_lm.h"
#include "fsdp/train/config.h"
#include "fsdp/train/telemetry.h"

namespace fsdp::train {

// Collective (gathers each parameter); rank 0 writes. `tokenizer` is the
// run's (null when it loaded none); `tokenizer_dir` is where one would come from.
void export_trained_model(models::CausalLMImpl& model, const TrainConfig::HfExport& config,
                          const std::string& tokenizer_dir, const data::Tokenizer* tokenizer, dist::World& world,
                          RunLog& log);

}  // namespace fsdp::train
