#pragma once
// Predicted tensor memory per rank for a training job, from the model's
// shapes and FSDP's buffer rules: no run needed. The step is walked as a
// timeline (forward unit by unit, the loss, backward unit by unit, the
// optimizer) and each moment's bytes are summed by part; the peak is the
// largest moment. docs/memory.md gives the formula of each part. Light
// header: no LibTorch.

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/models/shape.h"
#include "fsdp/train/config.h"

namespace fsdp::plan {

// What the prediction needs of a model: its family's shapes and memory
// formula (models/shape.h), read from a built (deferred) model by
// model_shape.h.
using ModelShape = models::ModelShape;

// What runs the job, where it differs from this CPU build.
struct Target {
  // The attention keeps nothing beyond q, k and v (this project's CPU
  // kernel, which recomputes its weights), or a row statistic too (flash
  // attention, as PyTorch's scaled_dot_product_attention runs on a GPU).
  bool flash_attention = false;
  // The loss as PyTorch's composite runs it (a GPU): bf16 logits, their
  // fp32 copy and the kept log-softmax, instead of the fused CPU kernel's
  // one buffer. The chunked loss is the CPU kernel's: off here.
  bool composite_loss = false;
  // SwiGLU's activation as LibTorch's operators (a GPU) rather than the
  // CPU's fused kernel.
  bool composite_elementwise = false;
  // torchtitan's selective (op-level) activation checkpointing instead of
  // the job's: each block keeps its input, every other matmul's output and
  // the attention's output, and recomputes the rest in backward.
  bool selective_checkpointing = false;
};

// One part of the memory held at a moment.
struct Part {
  std::string name;
  int64_t bytes = 0;
};

struct Moment {
  std::string phase;  // "forward h.3", "loss backward", "backward h.0", "optimizer"
  std::vector<Part> parts;
  int64_t total() const;
};

struct Prediction {
  Moment peak;                   // the largest moment
  std::vector<Moment> timeline;  // every moment walked, in order
  int64_t state_bytes = 0;       // sharded parameters + gradients + optimizer state, wherever they live
  // Host memory per rank for offloaded state (--cpu-offload: all of
  // state_bytes; --optimizer-offload: AdamW's moments in fp32 and the fp32
  // copies a step updates); none of it is in the timeline, which is the
  // compute device's.
  int64_t host_bytes = 0;
  std::vector<Part> host_parts;  // host_bytes by part
  int64_t block_activation_bytes = 0;    // what the largest block keeps for backward, without checkpointing
  int64_t block_checkpointed_bytes = 0;  // ... and with the job's checkpointing (its input; selective: more)
  // Mixture-of-Experts models: the peak when one expert gets every token
  // of a micro-batch (the prediction assumes balanced routing); 0 otherwise.
  int64_t worst_routing_peak_bytes = 0;
};

// `world` ranks run `job` (its model, data, fsdp and runtime sections).
// Throws fsdp::Error naming what the model cannot be predicted for.
Prediction predict(const ModelShape& model, const train::TrainConfig& job, int world, const Target& target = {});

// The units' shard size on this job's mesh: W, 1 (no_shard) or fsdp_size.
int shard_group_size(const train::TrainConfig& job, int world);

}  // namespace fsdp::plan
