#pragma once
// The shapes fsdp plan predicts from, read off the model the trainer would
// build (a preset, or --init-from's config.json), built with deferred
// parameters: no weights are allocated or read.

#include "fsdp/plan/memory_model.h"
#include "fsdp/train/config.h"

namespace fsdp::plan {

// Throws fsdp::Error naming the model when its family has no activation
// formulas (memory_model.h) or its blocks differ in size.
ModelShape model_shape(const train::TrainConfig::Model& model);

}  // namespace fsdp::plan
