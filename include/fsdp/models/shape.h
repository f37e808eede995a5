#pragma once
// A model's shapes as its family describes them, and its memory formula:
// what fsdp plan predicts from (plan/memory_model.h) and what the matmul
// bench times (bench/matmul_bench.h). Each family fills one in its
// family.cpp (FamilySpec::shape); the readers know no family by name.
// Light header: no LibTorch.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fsdp::models {

// One micro-batch on one rank, as the memory formulas size it: B
// sequences of T tokens (N = B * T rows), `compute` bytes per activation
// element (4 fp32, 2 bf16), and whether attention keeps a row statistic
// (flash attention, on a GPU) or nothing (the CPU kernel). A Mixture-of-Experts
// layer's experts get their tokens evenly (the expected load) or, with
// `worst_expert_load`, one expert gets every token (a token's k choices
// are distinct experts).
struct ActivationSizes {
  int64_t B = 0, T = 0, N = 0;
  int64_t compute = 4;
  bool flash = false;
  bool worst_expert_load = false;
  // SwiGLU's activation as LibTorch's two operators (a GPU), which keep
  // silu(gate) too, instead of nn::silu_mul, which keeps gate and up only.
  bool composite_swiglu = false;
};

// Bytes one block holds for backward: `kept` without checkpointing (its
// input included), `selective` under torchtitan's op-level selective
// checkpointing, `backward_transient` the largest gradients its backward
// holds at once besides what it keeps.
struct BlockMemory {
  int64_t kept = 0;
  int64_t selective = 0;
  int64_t backward_transient = 0;
};

// A weight matrix the blocks multiply by: `in` x `out` features, stored
// (in, out) and applied as x @ W when `in_out` (GPT-2's Conv1D), else
// (out, in) and x @ W^T. `per_layer` of them in each of `layers` layers
// (0: every layer); together they multiply `slots` rows per token (a
// routed layer's E experts share its N * k routing slots: N * k / E rows
// each at the expected load).
struct Projection {
  std::string name;
  int64_t in = 0, out = 0;
  bool in_out = false;
  int64_t layers = 0;
  int64_t per_layer = 1;
  int64_t slots = 1;
};

struct ModelShape {
  std::string family;  // the registry's name, for messages
  int64_t layers = 0;
  int64_t hidden = 0;  // C
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn = 0;  // the dense MLP's inner width (GPT-2: 4C)
  int64_t vocab = 0;
  int64_t max_seq_len = 0;
  bool layer_norm = false;  // the final norm is a LayerNorm (else RMSNorm)
  bool tied_head = false;   // the output head is the embedding's weight
  // The blocks' projections in forward order, attention's products aside.
  std::vector<Projection> projections;
  // Parameters of each block, in order, and of the rest (embeddings, final
  // norm, an untied head): counted off the built model by the planner.
  std::vector<int64_t> block_params;
  int64_t root_params = 0;
  // Of those, the trainable ones (all but a LoRA job's frozen base; empty
  // and -1 when not counted: all).
  std::vector<int64_t> block_trainable;
  int64_t root_trainable = -1;
  // The family's memory formula: block `layer`'s bytes for one micro-batch.
  std::function<BlockMemory(int64_t layer, const ActivationSizes& sizes)> block_memory;
};

// What the layers models are built from (nn/) keep for backward, for the
// families' formulas.
// The attention kernel, beyond q, k, v and its output: nothing for the CPU
// kernel (it recomputes its weights in backward), flash attention's per-row
// log-sum-exp (fp32) on a GPU. Chunked attention's windows keep what they
// would whole.
int64_t attention_kept(int64_t heads, const ActivationSizes& s);
// One RMSNorm over `rows` x `width` (nn::rms_norm_rows on the CPU,
// LibTorch's rms_norm on a GPU): besides its input (counted where it was
// made), its output (the next matmul's input), the per-row rstd in fp32,
// and in bf16 the fp32 copy of the weight the CPU kernel keeps.
int64_t rms_norm_saved(int64_t rows, int64_t width, const ActivationSizes& s);
// One SwiGLU activation over `rows` x `ffn`: gate, up and the product (the
// down projection's input), and silu(gate) where it is composite.
int64_t swiglu_kept(int64_t rows, int64_t ffn, const ActivationSizes& s);
// One LayerNorm: its output, per-row mean and rstd, and in bf16 the fp32
// copy of the weight nn::layer_norm_rows keeps.
int64_t layer_norm_saved(int64_t rows, int64_t width, const ActivationSizes& s);

}  // namespace fsdp::models
