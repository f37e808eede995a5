#pragma once
// The shapes fsdp plan predicts from, read off the model the trainer would
// build (a preset, or --init-from's config.json), built with deferred
// parameters: no weights are allocated or read.

#include "fsdp/plan/memory_model.h"
#include "fsdp/train/config.h"

namespace fsdp::plan {

// The family's shape (FamilySpec::shape) with each block's parameters
// counted off the model the job's model section names, LoRA's adapters
// included when its lora section adds them (and then the trainable ones
// apart). Throws fsdp::Error naming the model when its family has no memory
// formula.
ModelShape model_shape(const train::TrainConfig& job);

}  // namespace fsdp::plan
