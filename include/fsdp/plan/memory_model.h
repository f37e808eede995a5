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

#include "fsdp/train/config.h"

namespace fsdp::plan {

// What the prediction needs of a model: read from a built (deferred) model
// by model_shape.h, or written by hand in tests.
struct ModelShape {
  std::string family;  // gpt2, llama, qwen3 (the families with activation formulas)
  int64_t layers = 0;
  int64_t hidden = 0;  // C
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn = 0;  // the MLP's inner width (GPT-2: 4C)
  int64_t vocab = 0;
  int64_t max_seq_len = 0;
  int64_t block_params = 0;  // parameters of one block (every block alike)
  int64_t root_params = 0;   // the rest: embeddings, final norm, an untied head
  bool layer_norm = false;   // GPT-2's LayerNorm (else RMSNorm)
  bool qk_norm = false;      // Qwen3's per-head norms
};

// What runs the job, where it differs from this CPU build.
struct Target {
  // The attention keeps its probabilities (this project's CPU kernel: B x
  // heads x T x T), or only a row statistic (flash attention, as PyTorch's
  // scaled_dot_product_attention runs on a GPU).
  bool flash_attention = false;
  // The loss as PyTorch's composite runs it (a GPU): bf16 logits, their
  // fp32 copy and the kept log-softmax, instead of the fused CPU kernel's
  // one buffer. The chunked loss is the CPU kernel's: off here.
  bool composite_loss = false;
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
  int64_t state_bytes = 0;       // sharded parameters + gradients + optimizer state
  int64_t block_activation_bytes = 0;    // what one block keeps for backward, without checkpointing
  int64_t block_checkpointed_bytes = 0;  // ... and with the job's checkpointing (its input; selective: more)
};

// `world` ranks run `job` (its model, data, fsdp and runtime sections).
// Throws fsdp::Error naming what the model cannot be predicted for.
Prediction predict(const ModelShape& model, const train::TrainConfig& job, int world, const Target& target = {});

// The units' shard size on this job's mesh: W, 1 (no_shard) or fsdp_size.
int shard_group_size(const train::TrainConfig& job, int world);

}  // namespace fsdp::plan
