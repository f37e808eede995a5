#pragma once
// The parts of a training run, each built from its section of the
// configuration: the model (a preset or a Hugging Face directory), the
// data loaders, the mesh, FSDP over the model, the optimizer. The trainer
// calls them in order; nothing here decides when anything happens.

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "fsdp/data/loader.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/models/causal_lm.h"
#include "fsdp/models/hf/weights.h"
#include "fsdp/optim/fused_adamw.h"
#include "fsdp/train/config.h"
#include "fsdp/train/telemetry.h"

namespace fsdp::train {

torch::ScalarType precision_dtype(Precision p);

struct BuiltModel {
  models::CausalLM model;
  // --init-from: the weights fully_shard reads into each shard (the model's
  // parameters are deferred until then). Null for a preset.
  std::shared_ptr<models::HfWeights> init_weights;
  int64_t parameters = 0;  // unique parameters, counted once before sharding (LoRA's adapters included)
};
// Says what was built (and, under --print-model, its modules and shapes):
// the model section's model, with LoRA adapters when lora.rank > 0.
BuiltModel build_model(const TrainConfig& config, const dist::World& world, RunLog& log);

// What a LoRA run's frozen base is: its --init-from path and each weight
// file's name, size and CRC-32 (a preset: its name, seed and vocabulary).
// Kept in the run's checkpoints ([Note: a LoRA checkpoint holds the
// adapters], trainer_start.cpp reads it on resume).
nlohmann::json lora_base_identity(const TrainConfig& config);

// Frozen parameters are stored in the compute dtype (--precision bf16):
// nothing updates them, so no fp32 master copy is needed.
void keep_frozen_in_compute_dtype(models::CausalLMImpl& model, const TrainConfig& config);

// The training loader, or (`validation`) the evaluation one; says what it
// reads. The training loader sets runtime.steps from runtime.epochs when
// that is given: the data's rows (examples, or windows of seq_len tokens)
// times the epochs, in whole steps.
std::unique_ptr<data::DataLoader> build_loader(TrainConfig& config, const models::CausalLMImpl& model,
                                               const dist::World& world, bool validation, RunLog& log);

std::shared_ptr<dist::DeviceMesh> build_mesh(const TrainConfig::Fsdp& config, const std::shared_ptr<dist::World>& world);

// fully_shard over the model's units; under --print-model, lists them.
void apply_fsdp(models::CausalLMImpl& model, const TrainConfig& config, const std::shared_ptr<dist::DeviceMesh>& mesh,
                const std::shared_ptr<models::HfWeights>& init_weights, RunLog& log);

// Weight decay on matrices and embeddings, never on norms and biases:
// chosen on the unsharded model (parameters keep their identity through
// sharding, not their shape).
struct DecayGroups {
  std::vector<torch::Tensor> decay, no_decay;
};
DecayGroups choose_decay_groups(const torch::nn::Module& model);
std::unique_ptr<optim::FusedAdamW> build_optimizer(const TrainConfig::Optim& config, const DecayGroups& groups);

}  // namespace fsdp::train
