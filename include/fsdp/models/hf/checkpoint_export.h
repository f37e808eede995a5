#pragma once
// `fsdp ckpt export`: a sharded checkpoint as a Hugging Face directory
// (config.json + model.safetensors, or shards with an index), one full
// parameter at a time, named and configured by the family the checkpoint's
// recorded config.json names. It lives in models, above checkpoint: it joins
// the checkpoint's reader to the family's Hugging Face adapter, and only
// models knows Hugging Face's names.

#include <string>

#include "fsdp/models/hf/weights.h"

namespace fsdp::models {

// Writes OUT_DIR from CHECKPOINT (a step_N/ directory). Throws fsdp::Error
// naming the checkpoint when it records no Hugging Face architecture, or a
// file is missing or damaged.
void export_checkpoint_hf(const std::string& checkpoint, const std::string& out_dir,
                          const HfExportOptions& options = {});

}  // namespace fsdp::models
