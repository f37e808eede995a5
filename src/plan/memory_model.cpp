#include "fsdp/plan/memory_model.h"

#include <algorithm>

#include "fsdp/common/error.h"
#include "fsdp/nn/logits_layout.h"

namespace fsdp::plan {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Every size below is in bytes, for one rank and one micro-batch of
// B sequences of T tokens (N = B * T rows).
struct Sizes {
  int64_t B, T, N;
  int64_t master = 4;   // the module's dtype: fp32 (bf16 is a policy over it)
  int64_t compute = 4;  // gathered parameters and activations
  int64_t reduce = 4;   // gradients as reduced (fp32 under a bf16 policy)
  int64_t logits = 4;   // the head's output: bf16 when it runs in bf16
  bool flash = false;   // Target::flash_attention
};

// What the attention kernel keeps beyond q, k, v and its output: the
// probabilities, or flash attention's per-row log-sum-exp (fp32).
int64_t attention_kept(const ModelShape& m, const Sizes& s) {
  return s.flash ? s.B * m.heads * s.T * 4 : s.B * m.heads * s.T * s.T * s.compute;
}

// torchtitan's op-level selective checkpointing: the block's input, every
// other matmul's output in forward order (q, v, gate, down for Llama; qkv
// and c_fc for GPT-2) and the attention's output with its statistic.
int64_t selective_kept(const ModelShape& m, const Sizes& s) {
  const int64_t N = s.N, C = m.hidden, c = s.compute;
  if (m.family == "gpt2") return N * C * c + N * (3 * C + m.ffn + C) * c + attention_kept(m, s);
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  return N * C * c + N * (q + kv + m.ffn + C) * c + N * q * c + attention_kept(m, s);
}

// One RMSNorm (nn::RMSNorm, composite ops) over `rows` x `width`: what
// autograd keeps besides its input. fp32: the normalised rows and the
// output (the input, being its own fp32 form, is kept too: counted by the
// caller). bf16: the input's fp32 copy, the normalised rows cast back to
// bf16 and the output. Both keep rsqrt's per-row output.
int64_t rms_norm_saved(int64_t rows, int64_t width, const Sizes& s) {
  const int64_t elems = rows * width;
  const int64_t per_row = rows * 4;
  if (s.compute == 4) return elems * (4 + 4) + per_row;
  return elems * (4 + 2 + 2) + per_row;
}

// One LayerNorm: the output and per-row mean and rstd (and, in bf16, the
// fp32 copy of the weight nn::layer_norm_rows keeps). The input is counted
// where it was made.
int64_t layer_norm_saved(int64_t rows, int64_t width, const Sizes& s) {
  const int64_t stats = 2 * rows * 4;
  return rows * width * s.compute + stats + (s.compute == 4 ? 0 : width * 4);
}

// What one block keeps for backward, its input included.
int64_t block_activations(const ModelShape& m, const Sizes& s) {
  const int64_t N = s.N, C = m.hidden, c = s.compute;
  const int64_t probs = attention_kept(m, s);
  if (m.family == "gpt2") {
    // input, ln_1, c_attn's qkv (3C), attention output, residual h, ln_2,
    // c_fc's output (4C) and GELU's (4C): 15 C-wide rows and the input.
    return N * C * c + 2 * layer_norm_saved(N, C, s) + N * (3 * C + C + C + 2 * m.ffn) * c + probs;
  }
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  // The rotation's tables need no gradient, so it keeps nothing: q and k
  // after it are kept by the attention. Qwen3's per-head norms keep the
  // input's fp32 form (in fp32, the projection's output itself) and the
  // normalised rows (in the compute dtype), and rsqrt's output per head
  // and token; their output is not kept (the rotation does not need it).
  int64_t qk = N * (q + kv) * c;
  if (m.qk_norm) qk += N * (q + kv) * (4 + c) + N * (m.heads + m.kv_heads) * 4;
  return N * C * c                  // input
         + rms_norm_saved(N, C, s)  // input_layernorm
         + qk + N * kv * c          // q and k after the rotation, v
         + probs + N * q * c        // attention probabilities and output
         + N * C * c                // residual h (post_attention_layernorm's input)
         + rms_norm_saved(N, C, s)  // post_attention_layernorm
         + 4 * N * m.ffn * c;       // gate, silu(gate), up, their product
}

// The largest gradients a block's backward holds at once besides what it
// keeps: two ffn-wide gradients (an activation's input and output
// gradient) and the residual stream's.
int64_t block_backward_transient(const ModelShape& m, const Sizes& s) {
  return (2 * s.N * m.ffn + 2 * s.N * m.hidden) * s.compute;
}

// After the blocks: the last block's output, the final norm's keep, and
// its output (the loss's input).
int64_t head_activations(const ModelShape& m, const Sizes& s) {
  const int64_t norm = m.layer_norm ? layer_norm_saved(s.N, m.hidden, s) : rms_norm_saved(s.N, m.hidden, s);
  return s.N * m.hidden * s.compute + norm;
}

struct Unit {
  std::string name;
  int64_t params = 0;
  int64_t shard = 0;   // elements per rank
  int64_t padded = 0;  // shard * S
};

}  // namespace

int64_t Moment::total() const {
  int64_t t = 0;
  for (const auto& p : parts) t += p.bytes;
  return t;
}

int shard_group_size(const train::TrainConfig& job, int world) {
  switch (job.fsdp.sharding) {
    case ShardingStrategy::kNoShard:
      return 1;
    case ShardingStrategy::kHybridShard:
      return static_cast<int>(job.fsdp.fsdp_size);
    default:
      return world;
  }
}

Prediction predict(const ModelShape& m, const train::TrainConfig& job, int world, const Target& target) {
  FSDP_CHECK(m.family == "gpt2" || m.family == "llama" || m.family == "qwen3", "fsdp plan: the ", m.family,
             " family has no activation formulas yet (gpt2, llama and qwen3 have)");
  FSDP_CHECK(world >= 1, "fsdp plan: world size ", world, ": expected at least 1");
  const int S = shard_group_size(job, world);
  FSDP_CHECK(S >= 1 && world % S == 0, "fsdp plan: a shard group of ", S, " ranks does not divide ", world,
             " ranks (--fsdp-size)");
  FSDP_CHECK(m.max_seq_len <= 0 || job.data.seq_len <= m.max_seq_len, "data.seq_len ", job.data.seq_len,
             " exceeds the model's ", m.max_seq_len, " positions");
  FSDP_CHECK(job.fsdp.wrap_policy == "block", "fsdp plan: only --wrap-policy block is modelled");
  // Every part below is a product of these sizes, or a sum of such
  // products: bounded first, in floating point, so that no int64 overflows.
  {
    const long double B = job.data.batch_size, T = job.data.seq_len, N = B * T, L = m.layers, C = m.hidden, V = m.vocab,
                      I = m.ffn, H = m.heads, D = (m.heads + m.kv_heads) * m.head_dim,
                      P = m.root_params + L * m.block_params;
    const long double bound =
        64 * P + L * (B * H * T * T * 4 + N * (80 * C + 32 * I + 32 * D)) + 16 * N * V + 16 * V * C + 16 * N * C;
    FSDP_CHECK(bound < 1e18L, "fsdp plan: this job needs more than an exabyte per rank (", m.layers, " layers, ",
               job.data.batch_size, " x ", job.data.seq_len, " tokens): too large to plan");
  }
  Sizes s;
  s.B = job.data.batch_size;
  s.T = job.data.seq_len;
  s.N = s.B * s.T;
  const bool bf16 = job.runtime.precision == train::Precision::kBf16;
  FSDP_CHECK(job.runtime.precision != train::Precision::kFp16,
             "fsdp plan: fp16 is not modelled (bf16 is: the same sizes, without the loss scaler's state)");
  if (bf16) s.compute = s.logits = 2;
  s.flash = target.flash_attention;
  const bool aliased = S == 1 && !bf16;  // the shard is the unit: no gathered copy
  const bool full_shard =
      job.fsdp.sharding == ShardingStrategy::kFullShard || job.fsdp.sharding == ShardingStrategy::kHybridShard;
  // Explicit prefetch gathers exactly the next block, whatever the depth.
  const int64_t depth = job.fsdp.explicit_prefetch ? 1 : job.fsdp.prefetch_depth;

  const auto unit = [&](std::string name, int64_t params) {
    Unit u{std::move(name), params, ceil_div(params, S), 0};
    u.padded = u.shard * S;
    return u;
  };
  const Unit root = unit("root", m.root_params);
  const Unit block = unit("block", m.block_params);
  const int64_t L = m.layers;

  Prediction out;
  const int64_t shards = root.shard + L * block.shard;
  const int64_t params_bytes = shards * s.master;
  const int64_t optimizer_bytes = 2 * shards * s.master;  // AdamW's two moments, in the shards' dtype
  out.state_bytes = 2 * params_bytes + optimizer_bytes;
  const int64_t gathered_root = aliased ? 0 : root.padded * s.compute;
  const int64_t gathered_block = aliased ? 0 : block.padded * s.compute;
  const int64_t act_block = block_activations(m, s);
  const int64_t act_input = s.N * m.hidden * s.compute;
  const int64_t kept_per_block =
      target.selective_checkpointing ? selective_kept(m, s) : (job.model.activation_checkpoint ? act_input : act_block);
  out.block_activation_bytes = act_block;
  out.block_checkpointed_bytes = target.selective_checkpointing ? selective_kept(m, s) : act_input;
  const int64_t head_act = head_activations(m, s);
  const int64_t head_weight = m.vocab * m.hidden;
  const int64_t chunk_rows = std::min<int64_t>(1024, s.N);
  // nn::chunked_lm_loss chunks on a CPU only; elsewhere it is lm_loss.
  const bool chunked = job.model.chunk_loss && !target.composite_loss;
  // A unit's post-backward, at its largest: FSDP's flat gradient buffer
  // (compute dtype) beside autograd's fresh gradients being copied in (and
  // `gathered`, the unit's parameters, freed next), or beside their cast
  // to the reduce dtype; then the reduce-scatter's input with its receive
  // buffer and output shard (none of those with one rank: the input is the
  // shard).
  const auto reduction = [&](const Unit& u, int64_t gathered) -> int64_t {
    if (aliased) return 0;
    const int64_t buffer = u.padded * s.compute, fresh = u.params * s.compute;
    const int64_t cast = s.reduce != s.compute ? u.padded * s.reduce : 0;
    const int64_t scatter = S > 1 ? u.padded * s.reduce + u.shard * s.reduce : 0;
    return std::max({gathered + buffer + fresh, buffer + cast, (cast > 0 ? cast : buffer) + scatter});
  };
  // A unit that stays gathered after forward (the root; every unit under
  // shard_grad_op) makes its flat gradient buffer then, so that a
  // parameter used after it (a tied head) accumulates in place.
  const auto kept_grad_buffers = [&](int64_t blocks) {
    return aliased ? 0 : root.padded * s.compute + (full_shard ? 0 : blocks * block.padded * s.compute);
  };

  // With accumulation, each unit keeps its unsharded gradient (reduce
  // dtype) between micro-steps instead of reducing it (no sync); the last
  // micro-step, whose moments these are, holds all of them until each
  // unit's post-backward adds it in. In place, they accumulate in the
  // gradient buffers already counted.
  const bool accumulates = job.data.grad_accum > 1 && !aliased;
  const auto unsynced = [&](int64_t blocks) {
    return accumulates ? (root.padded + blocks * block.padded) * s.reduce : int64_t{0};
  };
  const auto moment = [&](std::string phase, std::vector<Part> parts) {
    Moment mo{std::move(phase), {{"sharded parameters", params_bytes}, {"optimizer state", optimizer_bytes}}};
    for (auto& p : parts) {
      if (p.bytes != 0) mo.parts.push_back(std::move(p));
    }
    out.timeline.push_back(std::move(mo));
  };
  const auto gathered_blocks = [&](int64_t n) { return std::min<int64_t>(n, L) * gathered_block; };

  // Gradients as the optimizer reads them (master dtype). In place (one
  // rank per shard group, no cast), each unit's gradient buffer is made at
  // its forward and the gradients land in it; otherwise a unit's reduced
  // shard appears at its post-backward.
  const auto sharded_grads = [&](int64_t blocks_with_grads, bool root_has) {
    const int64_t per_block = aliased ? block.params : block.shard;
    const int64_t per_root = aliased ? root.params : root.shard;
    return (blocks_with_grads * per_block + (root_has ? per_root : 0)) * s.master;
  };

  // Forward: block i gathered with `depth` ahead (all kept under
  // shard_grad_op), activations of blocks before it kept.
  for (int64_t i = 0; i < L; ++i) {
    const int64_t held = full_shard ? 1 + std::min(depth, L - 1 - i) : i + 1 + std::min(depth, L - 1 - i);
    // Under shard_grad_op each block done made its gradient buffer.
    moment("forward block " + std::to_string(i),
           {{"gathered units", gathered_root + gathered_blocks(held)},
            {"activations", i * kept_per_block + act_block},
            {"unsharded gradients and reduce-scatter", full_shard || aliased ? 0 : i * block.padded * s.compute},
            {"gradients", aliased ? sharded_grads(i + 1, true) : 0},
            {"gradients kept between micro-steps", unsynced(L)}});
  }
  // The loss: logits kept (or one chunk at a time), then its backward.
  const int64_t blocks_kept = L * kept_per_block + head_act;
  const int64_t gathered_after_forward = gathered_root + (full_shard ? 0 : gathered_blocks(L));
  const int64_t grads_after_forward = aliased ? sharded_grads(L, true) : 0;
  // Composite (GPU): bf16 logits, their fp32 copy and the log-softmax
  // while the loss runs; the log-softmax alone is kept for backward.
  const int64_t logits_row = target.composite_loss ? m.vocab * (s.logits + 4 + 4) : m.vocab * s.logits;
  // The fused CPU kernel keeps fp32 logits transposed, in padded rows.
  const bool transposed = !target.composite_loss && s.logits == 4;
  const int64_t logits =
      chunked ? chunk_rows * logits_row : (transposed ? nn::transposed_logits_stride(s.N) : s.N) * logits_row;
  moment("loss", {{"gathered units", gathered_after_forward},
                  {"activations", blocks_kept},
                  {"logits and loss", logits},
                  {"unsharded gradients and reduce-scatter", kept_grad_buffers(L)},
                  {"gradients", grads_after_forward},
                  {"gradients kept between micro-steps", unsynced(L)}});
  // Loss backward: the hidden rows' gradient and the head's (vocab x C);
  // chunked, also an fp32 sum of the head's gradient and a chunk's logits.
  int64_t loss_backward = s.N * m.hidden * s.compute + head_weight * s.compute;
  if (chunked) {
    loss_backward += head_weight * 4 + chunk_rows * m.vocab * s.logits;
  } else if (target.composite_loss) {
    // The kept log-softmax, its gradient and the logits' gradient (fp32).
    loss_backward += s.N * m.vocab * (4 + 4 + 4);
  } else {
    loss_backward += logits;  // the fused kernel left the gradient in the logits' buffer
  }
  moment("loss backward", {{"gathered units", gathered_after_forward},
                           {"activations", blocks_kept},
                           {"logits and loss", loss_backward},
                           {"unsharded gradients and reduce-scatter", kept_grad_buffers(L)},
                           {"gradients", grads_after_forward},
                           {"gradients kept between micro-steps", unsynced(L)}});
  // Backward, last block first: its activations (recomputed under
  // checkpointing) with the gradients it makes (its flat gradient buffer
  // and autograd's fresh gradients), then its post-backward, its own
  // activations gone; the reduced gradients of the blocks done. The head's
  // gradient went into the root's buffer at the root's pre-backward,
  // right after the loss's backward.
  const int64_t block_grads = aliased ? 0 : block.padded * s.compute + block.params * s.compute;
  for (int64_t i = L - 1; i >= 0; --i) {
    const int64_t held = full_shard ? 1 + std::min(depth, i) : i + 1;
    const int64_t gradients = aliased ? grads_after_forward : sharded_grads(L - 1 - i, false);
    moment("backward block " + std::to_string(i),
           {{"gathered units", gathered_root + gathered_blocks(held)},
            {"activations", i * kept_per_block + act_block + block_backward_transient(m, s)},
            {"unsharded gradients and reduce-scatter", block_grads + kept_grad_buffers(i)},
            {"gradients", gradients},
            {"gradients kept between micro-steps", unsynced(i + 1)}});
    moment("post-backward block " + std::to_string(i),
           {{"gathered units", gathered_root + gathered_blocks(held)},
            {"activations", i * kept_per_block},
            {"unsharded gradients and reduce-scatter", reduction(block, 0) + kept_grad_buffers(i)},
            {"gradients", gradients},
            {"gradients kept between micro-steps", unsynced(i + 1)}});
  }
  // The root's, its own gathered parameters and its fresh gradients (the
  // head's and the embedding's) inside.
  moment("backward root", {{"unsharded gradients and reduce-scatter", reduction(root, gathered_root)},
                           {"gradients kept between micro-steps", unsynced(0)},
                           {"gradients", sharded_grads(L, aliased)}});
  moment("optimizer", {{"gradients", params_bytes}});

  out.peak = *std::max_element(out.timeline.begin(), out.timeline.end(),
                               [](const Moment& a, const Moment& b) { return a.total() < b.total(); });
  return out;
}

}  // namespace fsdp::plan
