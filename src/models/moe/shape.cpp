#include "fsdp/models/moe/shape.h"

#include <algorithm>

namespace fsdp::models {

// What the dispatch ([Note: expert dispatch]) keeps does not depend on how
// the tokens spread: the experts together compute exactly N * k rows, and
// each keeps its gathered rows and its SwiGLU's intermediates for
// them. How they spread shows only in backward, one expert at a time: its
// rows' gradients are the transient.
BlockMemory add_routed_memory(BlockMemory m, int64_t C, const MoEConfig& moe, int64_t shared_ffn,
                              const ActivationSizes& s) {
  const int64_t N = s.N, cb = s.compute, E = moe.num_experts, k = moe.num_experts_per_tok;
  const int64_t I = moe.moe_intermediate_size, routed = N * k;
  // The router's fp32 probabilities (E per token); per slot its top-k
  // index, its order and token id (int64 each), its weight in fp32 and in
  // the compute dtype; Qwen3-MoE's renormalisation keeps the sum per token.
  const int64_t router = N * E * 4 + routed * (8 + 8 + 8 + 4 + cb) + (moe.norm_topk_prob ? N * 4 : 0);
  // Per routed row: the gathered row, the expert's output and the weighted
  // one (Qwen3-MoE; Llama 4 weights the input: the rows, the weighted rows
  // and the output), and its SwiGLU's.
  const int64_t experts = routed * 3 * C * cb + swiglu_kept(routed, I, s);
  const int64_t shared = swiglu_kept(N, shared_ffn, s);
  m.kept += router + experts + shared;
  // Selective checkpointing is not modelled inside a routed layer: it is
  // counted as keeping everything (an upper bound).
  m.selective += router + experts + shared;
  const int64_t rows = s.worst_expert_load ? N : (routed + E - 1) / E;
  m.backward_transient = std::max(m.backward_transient, (2 * std::max(rows * I, N * shared_ffn) + 2 * N * C) * cb);
  return m;
}

}  // namespace fsdp::models
