#include "fsdp/models/llama/shape.h"

#include <vector>

#include "fsdp/models/moe/shape.h"

namespace fsdp::models {

BlockMemory llama_dense_block_memory(const LlamaConfig& c, int64_t ffn, const ActivationSizes& s, QkNorm qk_norm) {
  const int64_t N = s.N, C = c.hidden_size, cb = s.compute, hd = c.head_size();
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  const int64_t q = heads * hd, kv = kv_heads * hd;
  const int64_t attention = attention_kept(heads, s);
  // The rotation's tables need no gradient, so it keeps nothing: q and k
  // after it are kept by the attention. Qwen3's per-head norms keep their
  // input (the projection's output) and rstd per head and token; their
  // output is not kept (the rotation does not need it).
  // Llama 4's L2 norm has no weight: it keeps its input's fp32 form and
  // rsqrt's output, not the normalised rows.
  int64_t qk = N * (q + kv) * cb;
  if (qk_norm == QkNorm::kRms) qk += N * (q + kv) * cb + N * (heads + kv_heads) * 4;
  if (qk_norm == QkNorm::kL2) qk += N * (q + kv) * 4 + N * (heads + kv_heads) * 4;
  BlockMemory m;
  m.kept = N * C * cb                      // input
           + rms_norm_saved(N, C, s)       // input_layernorm
           + qk + N * kv * cb              // q and k after the rotation, v
           + attention + N * q * cb        // the attention's own (flash: a statistic) and output
           + N * C * cb                    // residual h (post_attention_layernorm's input)
           + rms_norm_saved(N, C, s)       // post_attention_layernorm
           + swiglu_kept(N, ffn, s);       // gate, up, their product (and silu(gate))
  // torchtitan's op-level selective checkpointing: the block's input,
  // every other matmul's output in forward order (q, v, gate, down) and
  // the attention's output with its statistic.
  m.selective = N * C * cb + N * (q + kv + ffn + C) * cb + N * q * cb + attention;
  // Two ffn-wide gradients (an activation's input and output gradient)
  // and the residual stream's.
  m.backward_transient = (2 * N * ffn + 2 * N * C) * cb;
  return m;
}

std::vector<Projection> llama_attention_projections(const LlamaConfig& c) {
  const int64_t C = c.hidden_size, hd = c.head_size();
  const int64_t q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd;
  return {{"q", C, q}, {"k", C, kv}, {"v", C, kv}, {"attention out", q, C}};
}

void add_swiglu_projections(std::vector<Projection>& out, const std::string& prefix, int64_t hidden, int64_t ffn,
                            int64_t layers, int64_t per_layer, int64_t slots) {
  out.push_back({prefix + " gate", hidden, ffn, false, layers, per_layer, slots});
  out.push_back({prefix + " up", hidden, ffn, false, layers, per_layer, slots});
  out.push_back({prefix + " down", ffn, hidden, false, layers, per_layer, slots});
}

ModelShape llama_shape(const LlamaConfig& c) {
  ModelShape s;
  s.family = c.family;
  s.layers = c.num_hidden_layers;
  s.hidden = c.hidden_size;
  s.heads = c.num_attention_heads;
  s.kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_size();
  s.ffn = c.intermediate_size;
  s.vocab = c.vocab_size;
  s.max_seq_len = c.max_position_embeddings;
  s.tied_head = c.tie_word_embeddings;
  const int64_t C = c.hidden_size;
  s.projections = llama_attention_projections(c);
  const int64_t sparse = static_cast<int64_t>(c.moe.sparse_layers(c.num_hidden_layers).size());
  if (sparse < s.layers) add_swiglu_projections(s.projections, "mlp", C, s.ffn, sparse > 0 ? s.layers - sparse : 0);
  if (sparse > 0) {
    const auto& m = c.moe;
    s.projections.push_back({"router", C, m.num_experts, false, sparse});
    add_swiglu_projections(s.projections, "expert", C, m.moe_intermediate_size, sparse, m.num_experts,
                           m.num_experts_per_tok);
  }
  s.block_memory = [c](int64_t layer, const ActivationSizes& sizes) {
    const auto qk = c.qk_norm ? QkNorm::kRms : QkNorm::kNone;
    if (!c.moe.is_sparse(layer)) return llama_dense_block_memory(c, c.intermediate_size, sizes, qk);
    auto m = llama_dense_block_memory(c, 0, sizes, qk);
    return add_routed_memory(m, c.hidden_size, c.moe, /*shared_expert_ffn=*/0, sizes);
  };
  return s;
}

}  // namespace fsdp::models
