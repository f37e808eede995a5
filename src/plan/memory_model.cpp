#include "fsdp/plan/memory_model.h"

#include <algorithm>

#include "fsdp/common/error.h"
#include "fsdp/nn/logits_layout.h"

namespace fsdp::plan {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Every size below is in bytes, for one rank and one micro-batch of
// B sequences of T tokens (N = B * T rows); the family's formula
// (models/shape.h) gives each block's.
struct Sizes : models::ActivationSizes {
  int64_t master = 4;  // the module's dtype: fp32 (bf16 is a policy over it)
  int64_t reduce = 4;  // gradients as reduced (fp32 under a bf16 policy)
  int64_t logits = 4;  // the head's output: bf16 when it runs in bf16
};

// After the blocks: the last block's output, the final norm's keep, and
// its output (the loss's input).
int64_t head_activations(const ModelShape& m, const Sizes& s) {
  const int64_t norm =
      m.layer_norm ? models::layer_norm_saved(s.N, m.hidden, s) : models::rms_norm_saved(s.N, m.hidden, s);
  return s.N * m.hidden * s.compute + norm;
}

struct Unit {
  std::string name;
  int64_t params = 0;
  int64_t shard = 0;   // elements per rank
  int64_t padded = 0;  // shard * S
  int64_t trainable = 0;        // parameters that get gradients (all but a LoRA job's frozen base)
  int64_t trainable_shard = 0;  // ... per rank: what AdamW keeps moments of
  // What gradients travel in: the whole unit's flat shard, or under LoRA
  // with a bf16 policy only the adapters' (the frozen base is kept in bf16,
  // a flat shard of its own that is never reduced: [Note: a unit of
  // several dtypes]).
  int64_t grad_params = 0, grad_shard = 0, grad_padded = 0;
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

namespace {

// The per-rank timeline of one step on shard groups of S ranks.
Prediction walk(const ModelShape& m, const train::TrainConfig& job, int S, const Target& target, const Sizes& s) {
  // Offload ([Note: CPU offload], [Note: optimizer offload]): --cpu-offload
  // keeps the sharded parameters, the gradients handed to the optimizer and
  // its state on the host, and gathers over one rank too (a copy from the
  // host); --optimizer-offload keeps AdamW's moments there.
  const bool cpu_offload = job.fsdp.cpu_offload;
  const bool optimizer_offload = job.fsdp.optimizer_offload;
  // The shard is the unit: no gathered copy.
  const bool aliased = S == 1 && s.compute == 4 && !cpu_offload;
  // Whether blocks free their gathered parameters after forward: the
  // strategy decides unless --reshard-after-forward names a number of
  // ranks (1 keeps them gathered).
  const int64_t keep_over = job.fsdp.reshard_after_forward;
  const bool full_shard = keep_over > 0 ? keep_over > 1
                                        : job.fsdp.sharding == ShardingStrategy::kFullShard ||
                                              job.fsdp.sharding == ShardingStrategy::kHybridShard;
  // Kept sharded over fewer ranks than the shard group: each block keeps
  // 1/k of its gathered buffer from its post-forward until its backward's
  // gather has read it (core/fsdp_param_group.cpp, [Note: resharding to
  // fewer ranks]). Blocks [first, last)'s.
  const bool partial = !aliased && keep_over > 1 && keep_over < S;
  // Explicit prefetch gathers exactly the next block, whatever the depth.
  const int64_t depth = job.fsdp.explicit_prefetch ? 1 : job.fsdp.prefetch_depth;

  // LoRA under a bf16 policy: the frozen base is stored in bf16 beside
  // fp32 adapters, a dtype (and a flat shard) of its own.
  const bool lora = job.lora.rank > 0;
  const bool base_apart = lora && s.compute != s.master;
  const int64_t frozen_bytes = base_apart ? s.compute : s.master;
  const auto unit = [&](std::string name, int64_t params, int64_t trainable) {
    Unit u{std::move(name), params, ceil_div(params, S), 0};
    u.padded = u.shard * S;
    u.trainable = trainable < 0 ? params : trainable;
    u.trainable_shard = ceil_div(u.trainable, S);
    u.grad_params = base_apart ? u.trainable : params;
    u.grad_shard = ceil_div(u.grad_params, S);
    u.grad_padded = u.grad_shard * S;
    return u;
  };
  const auto trainable_of = [&](int64_t i) {
    return m.block_trainable.empty() ? int64_t{-1} : m.block_trainable[static_cast<size_t>(i)];
  };
  const Unit root = unit("root", m.root_params, m.root_trainable);
  const int64_t L = m.layers;
  // Per block: its unit, what it keeps for backward, under the job's
  // checkpointing, and its backward's transient.
  std::vector<Unit> block;
  std::vector<int64_t> act_block, kept, transient;
  const int64_t act_input = s.N * m.hidden * s.compute;
  Prediction out;
  for (int64_t i = 0; i < L; ++i) {
    block.push_back(unit("block " + std::to_string(i), m.block_params[static_cast<size_t>(i)], trainable_of(i)));
    const auto mem = m.block_memory(i, s);
    act_block.push_back(mem.kept);
    kept.push_back(target.selective_checkpointing ? mem.selective
                                                  : (job.model.activation_checkpoint ? act_input : mem.kept));
    transient.push_back(mem.backward_transient);
    out.block_activation_bytes = std::max(out.block_activation_bytes, mem.kept);
    out.block_checkpointed_bytes =
        std::max(out.block_checkpointed_bytes, target.selective_checkpointing ? mem.selective : act_input);
  }
  // Prefix sums over the blocks: [0, i) of each per-block quantity.
  std::vector<int64_t> kept_sum{0}, padded_sum{0}, shard_sum{0}, trainable_shard_sum{0}, grad_params_sum{0},
      grad_shard_sum{0}, grad_padded_sum{0};
  for (size_t j = 0; j < block.size(); ++j) {
    kept_sum.push_back(kept_sum.back() + kept[j]);
    padded_sum.push_back(padded_sum.back() + block[j].padded);
    shard_sum.push_back(shard_sum.back() + block[j].shard);
    trainable_shard_sum.push_back(trainable_shard_sum.back() + block[j].trainable_shard);
    grad_params_sum.push_back(grad_params_sum.back() + block[j].grad_params);
    grad_shard_sum.push_back(grad_shard_sum.back() + block[j].grad_shard);
    grad_padded_sum.push_back(grad_padded_sum.back() + block[j].grad_padded);
  }
  // Blocks [first, last) of one of them.
  const auto range = [&](const std::vector<int64_t>& sums, int64_t first, int64_t last) {
    first = std::clamp<int64_t>(first, 0, L);
    last = std::clamp<int64_t>(last, first, L);
    return sums[static_cast<size_t>(last)] - sums[static_cast<size_t>(first)];
  };
  const auto kept_before = [&](int64_t i) { return range(kept_sum, 0, i); };
  const auto padded = [&](int64_t first, int64_t last) { return range(padded_sum, first, last); };
  const auto grad_padded = [&](int64_t first, int64_t last) { return range(grad_padded_sum, first, last); };

  const int64_t shards = root.shard + range(shard_sum, 0, L);
  const int64_t trainable_shards = root.trainable_shard + range(trainable_shard_sum, 0, L);
  const int64_t grad_shards = root.grad_shard + range(grad_shard_sum, 0, L);
  const int64_t params_bytes = trainable_shards * s.master + (shards - trainable_shards) * frozen_bytes;
  const int64_t optimizer_bytes = 2 * trainable_shards * s.master;  // AdamW's two moments, in the shards' dtype
  // DPO without LoRA: the frozen reference, sharded as the policy, stored
  // in the compute dtype (with LoRA the reference is the base, adapters off).
  const int64_t reference_bytes =
      job.objective.name == train::ObjectiveKind::kDpo && !lora ? shards * s.compute : 0;
  out.state_bytes = params_bytes + grad_shards * s.master + optimizer_bytes + reference_bytes;
  // The host's: the offloaded state, and under optimizer offload the fp32
  // copies of parameters and gradients a step updates there, with fp32
  // moments whatever the shards' dtype.
  if (cpu_offload) {
    out.host_parts = {{"sharded parameters", params_bytes + reference_bytes},
                      {"gradients", grad_shards * s.master},
                      {"optimizer state", optimizer_bytes}};
  }
  if (optimizer_offload) {
    out.host_parts = {{"optimizer state", 2 * trainable_shards * 4},
                      {"fp32 copies of parameters and gradients (the step)", 2 * trainable_shards * 4}};
  }
  for (const auto& p : out.host_parts) out.host_bytes += p.bytes;
  const int64_t gathered_root = aliased ? 0 : root.padded * s.compute;
  const auto gathered_blocks = [&](int64_t first, int64_t last) {
    return aliased ? 0 : padded(first, last) * s.compute;
  };
  const auto kept_parts = [&](int64_t first, int64_t last) {
    return partial ? padded(first, last) / keep_over * s.compute : int64_t{0};
  };
  const std::string kept_name = "parameters kept over " + std::to_string(keep_over) + " ranks";
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
  // `before`: the previous unit's reduce-scatter, still in flight while
  // this one collects and casts (in_flight, below).
  const auto reduction = [&](const Unit& u, int64_t gathered, int64_t fresh, int64_t before) -> int64_t {
    if (aliased) return 0;
    const int64_t buffer = u.grad_padded * s.compute;
    const int64_t cast = s.reduce != s.compute ? u.grad_padded * s.reduce : 0;
    const int64_t scatter = S > 1 ? u.grad_padded * s.reduce + u.grad_shard * s.reduce : 0;
    return std::max({gathered + buffer + fresh + before, buffer + cast + before, (cast > 0 ? cast : buffer) + scatter});
  };
  // A unit's reduce-scatter stays in flight until the next unit's
  // post-backward waits on it (core/comm_context.cpp: reduce() finishes the
  // one before it, then issues its own): through the next unit's backward
  // and the start of its post-backward, its input (the staged gradient,
  // reduce dtype) and Gloo's receive buffer of the same size are held. Its
  // output shard is counted in "gradients" from its issue on. With one rank
  // per shard group there is no collective.
  const auto in_flight = [&](const Unit& u) -> int64_t { return aliased || S == 1 ? 0 : 2 * u.grad_padded * s.reduce; };
  // A tied head (its weight the embedding's: the root then holds the
  // vocabulary's V x C once, not twice) cannot hand its gradient to the
  // root's buffer at the root's pre-backward: the weight's one gradient
  // accumulator has two inputs, so autograd holds the head's gradient in
  // its input buffer until the embedding's backward, the last, has made
  // the other.
  const bool tied = m.tied_head && root.trainable == root.params;  // (LoRA freezes it: no gradient)
  const bool head_trains = root.trainable == root.params;
  const int64_t tied_grad = tied ? m.vocab * m.hidden * s.compute : 0;
  // A unit that stays gathered after forward (the root; every unit under
  // shard_grad_op) makes its flat gradient buffer then, so that a
  // parameter used after it (a tied head) accumulates in place: the root
  // and, under shard_grad_op, blocks [0, n).
  const auto kept_grad_buffers = [&](int64_t n) {
    return aliased ? 0 : root.grad_padded * s.compute + (full_shard ? 0 : grad_padded(0, n) * s.compute);
  };

  // With accumulation, each unit keeps its unsharded gradient (reduce
  // dtype) between micro-steps instead of reducing it (no sync); the last
  // micro-step, whose moments these are, holds all of them until each
  // unit's post-backward adds it in. In place, they accumulate in the
  // gradient buffers already counted. The root's and blocks [0, n)'s.
  // --accumulate sharded: each micro-step's gradients are reduce-scattered
  // and added into the shards, which the earlier micro-steps made: from
  // the last one's start every unit's shard is held, the root's and blocks
  // [0, n)'s beside those "gradients" counts.
  const bool accumulates = job.data.grad_accum > 1 && !aliased;
  const bool into_shards = job.fsdp.accumulate == train::Accumulate::kSharded;
  const auto unsynced = [&](int64_t n) {
    if (!accumulates || (into_shards && cpu_offload)) return int64_t{0};  // offloaded: added on the host
    return into_shards ? (root.grad_shard + range(grad_shard_sum, 0, n)) * s.master
                       : (root.grad_padded + grad_padded(0, n)) * s.reduce;
  };
  const auto moment = [&](std::string phase, std::vector<Part> parts) {
    Moment mo{std::move(phase), {}};
    if (!cpu_offload) mo.parts.push_back({"sharded parameters", params_bytes});
    if (!cpu_offload && reference_bytes > 0) mo.parts.push_back({"the DPO reference's shards", reference_bytes});
    if (!cpu_offload && !optimizer_offload) mo.parts.push_back({"optimizer state", optimizer_bytes});
    for (auto& p : parts) {
      if (cpu_offload && p.name == "gradients") continue;  // reduced shards land on the host
      if (p.bytes != 0) mo.parts.push_back(std::move(p));
    }
    out.timeline.push_back(std::move(mo));
  };

  // Gradients as the optimizer reads them (master dtype). In place (one
  // rank per shard group, no cast), each unit's gradient buffer is made at
  // its forward and the gradients land in it; otherwise a unit's reduced
  // shard appears at its post-backward. Blocks [first, last) and the root.
  const auto sharded_grads = [&](int64_t first, int64_t last, bool root_has) {
    const int64_t blocks = range(aliased ? grad_params_sum : grad_shard_sum, first, last);
    return (blocks + (root_has ? (aliased ? root.grad_params : root.grad_shard) : 0)) * s.master;
  };

  // Forward: block i gathered with `depth` ahead (all kept under
  // shard_grad_op), activations of blocks before it kept.
  for (int64_t i = 0; i < L; ++i) {
    const int64_t ahead = i + 1 + std::min(depth, L - 1 - i);
    // Under shard_grad_op each block done made its gradient buffer.
    moment("forward block " + std::to_string(i),
           {{"gathered units", gathered_root + gathered_blocks(full_shard ? i : 0, ahead)},
            {kept_name, kept_parts(0, i)},
            {"activations", kept_before(i) + act_block[static_cast<size_t>(i)]},
            {"unsharded gradients and reduce-scatter", full_shard || aliased ? 0 : grad_padded(0, i) * s.compute},
            {"gradients", aliased ? sharded_grads(0, i + 1, true) : 0},
            {"gradients kept between micro-steps", unsynced(L)}});
  }
  // The loss: logits kept (or one chunk at a time), then its backward.
  const int64_t blocks_kept = kept_before(L) + head_act;
  const int64_t gathered_after_forward = gathered_root + (full_shard ? 0 : gathered_blocks(0, L));
  const int64_t grads_after_forward = aliased ? sharded_grads(0, L, true) : 0;
  // Composite (GPU): bf16 logits, their fp32 copy and the log-softmax
  // while the loss runs; the log-softmax alone is kept for backward.
  const int64_t logits_row = target.composite_loss ? m.vocab * (s.logits + 4 + 4) : m.vocab * s.logits;
  // The fused CPU kernel keeps fp32 logits transposed, in padded rows.
  const bool transposed = !target.composite_loss && s.logits == 4;
  const int64_t logits =
      chunked ? chunk_rows * logits_row : (transposed ? nn::transposed_logits_stride(s.N) : s.N) * logits_row;
  moment("loss", {{"gathered units", gathered_after_forward},
                  {kept_name, kept_parts(0, L)},
                  {"activations", blocks_kept},
                  {"logits and loss", logits},
                  {"unsharded gradients and reduce-scatter", kept_grad_buffers(L)},
                  {"gradients", grads_after_forward},
                  {"gradients kept between micro-steps", unsynced(L)}});
  // Loss backward: the hidden rows' gradient and the head's (vocab x C);
  // chunked, also an fp32 sum of the head's gradient and a chunk's logits.
  int64_t loss_backward = s.N * m.hidden * s.compute + (head_trains ? head_weight * s.compute : 0);
  if (chunked) {
    loss_backward += head_weight * 4 + chunk_rows * m.vocab * s.logits;
  } else if (target.composite_loss) {
    // The kept log-softmax, its gradient and the logits' gradient (fp32).
    loss_backward += s.N * m.vocab * (4 + 4 + 4);
  } else {
    loss_backward += logits;  // the fused kernel left the gradient in the logits' buffer
  }
  moment("loss backward", {{"gathered units", gathered_after_forward},
                           {kept_name, kept_parts(0, L)},
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
  for (int64_t i = L - 1; i >= 0; --i) {
    const auto& b = block[static_cast<size_t>(i)];
    const int64_t first_held = full_shard ? i - std::min(depth, i) : 0;
    const int64_t gradients = aliased ? grads_after_forward : sharded_grads(i + 1, L, false);
    const int64_t block_grads = aliased ? 0 : b.grad_padded * s.compute + b.trainable * s.compute;
    const int64_t before = i + 1 < L ? in_flight(block[static_cast<size_t>(i + 1)]) : 0;
    moment("backward block " + std::to_string(i),
           {{"gathered units", gathered_root + gathered_blocks(first_held, i + 1)},
            {kept_name, kept_parts(0, first_held)},
            {"activations", kept_before(i) + act_block[static_cast<size_t>(i)] + transient[static_cast<size_t>(i)]},
            {"unsharded gradients and reduce-scatter", block_grads + kept_grad_buffers(i) + before},
            {"the tied head's gradient", tied_grad},
            {"gradients", gradients},
            {"gradients kept between micro-steps", unsynced(i + 1)}});
    moment("post-backward block " + std::to_string(i),
           {{"gathered units", gathered_root + gathered_blocks(first_held, i + 1)},
            {kept_name, kept_parts(0, first_held)},
            {"activations", kept_before(i)},
            {"unsharded gradients and reduce-scatter",
             reduction(b, 0, b.trainable * s.compute, before) + kept_grad_buffers(i)},
            {"the tied head's gradient", tied_grad},
            {"gradients", gradients},
            {"gradients kept between micro-steps", unsynced(i + 1)}});
  }
  // The root's: the embedding's backward and the root's post-backward, its
  // own gathered parameters and its fresh gradients inside, block 0's
  // reduce-scatter in flight until the root's own is issued. Tied, the
  // embedding's dense gradient (V x C) is made beside the head's held one
  // before autograd sums them: two at once. In place, the fresh ones (the
  // embeddings'; an untied head's went in after the loss's backward) are
  // added into the gradient buffer and freed.
  const int64_t root_fresh = root.trainable * s.compute + tied_grad;
  const int64_t embedding_fresh =
      head_trains ? (tied ? root.params : root.params - head_weight) * s.compute + tied_grad : 0;
  moment("backward root", {{"unsharded gradients and reduce-scatter",
                            reduction(root, gathered_root, root_fresh, L > 0 ? in_flight(block[0]) : 0)},
                           {"fresh gradients", aliased ? embedding_fresh : 0},
                           {"gradients kept between micro-steps", unsynced(0)},
                           {"gradients", sharded_grads(0, L, aliased)}});
  moment("optimizer", {{"gradients", grad_shards * s.master}});

  out.peak = *std::max_element(out.timeline.begin(), out.timeline.end(),
                               [](const Moment& a, const Moment& b) { return a.total() < b.total(); });
  return out;
}

}  // namespace

Prediction predict(const ModelShape& m, const train::TrainConfig& job, int world, const Target& target) {
  FSDP_CHECK(m.block_memory != nullptr && static_cast<int64_t>(m.block_params.size()) == m.layers,
             "fsdp plan: the ", m.family, " model's shape has no memory formula or no block sizes");
  FSDP_CHECK(world >= 1, "fsdp plan: world size ", world, ": expected at least 1");
  const int S = shard_group_size(job, world);
  FSDP_CHECK(S >= 1 && world % S == 0, "fsdp plan: a shard group of ", S, " ranks does not divide ", world,
             " ranks (--fsdp-size)");
  job.validate_for_shard_group(S);
  FSDP_CHECK(m.max_seq_len <= 0 || job.data.seq_len <= m.max_seq_len, "data.seq_len ", job.data.seq_len,
             " exceeds the model's ", m.max_seq_len, " positions");
  FSDP_CHECK(job.fsdp.wrap_policy == "block", "fsdp plan: only --wrap-policy block is modelled");
  FSDP_CHECK(job.runtime.precision != train::Precision::kFp16,
             "fsdp plan: fp16 is not modelled (bf16 is: the same sizes, without the loss scaler's state)");
  Sizes s;
  // DPO: each of a micro-batch's B pairs is two rows, chosen and rejected.
  s.B = job.data.batch_size * (job.objective.name == train::ObjectiveKind::kDpo ? 2 : 1);
  s.T = job.data.seq_len;
  s.N = s.B * s.T;
  if (job.runtime.precision == train::Precision::kBf16) s.compute = s.logits = 2;
  s.flash = target.flash_attention;
  s.composite_swiglu = target.composite_elementwise;
  // Every part is a product of these sizes, or a sum of such products:
  // bounded first, in floating point, so that no int64 overflows. A
  // block's formula is linear in its rows apart from attention's T x T:
  // one row's bytes (a one-token micro-batch) bound the rest.
  {
    const long double B = s.B, T = s.T, N = B * T, C = m.hidden, V = m.vocab, H = m.heads;
    long double P = m.root_params, per_row = 0;
    models::ActivationSizes one;
    one.B = one.T = one.N = 1;
    one.worst_expert_load = true;
    for (int64_t i = 0; i < m.layers; ++i) {
      P += static_cast<long double>(m.block_params[static_cast<size_t>(i)]);
      const auto b = m.block_memory(i, one);
      per_row += static_cast<long double>(b.kept + b.selective + b.backward_transient);
    }
    const long double L = m.layers;
    const long double bound = 64 * P + L * B * H * T * T * 4 + 8 * N * per_row + 16 * N * V + 16 * V * C + 16 * N * C;
    FSDP_CHECK(bound < 1e18L, "fsdp plan: this job needs more than an exabyte per rank (", m.layers, " layers, ",
               job.data.batch_size, " x ", job.data.seq_len, " tokens): too large to plan");
  }
  auto out = walk(m, job, S, target, s);
  // Routing shows only where some block's formula depends on it.
  Sizes worst = s;
  worst.worst_expert_load = true;
  bool routed = false;
  for (int64_t i = 0; i < m.layers && !routed; ++i) {
    routed = m.block_memory(i, s).backward_transient != m.block_memory(i, worst).backward_transient;
  }
  if (routed) {
    const auto worst_peak = walk(m, job, S, target, worst).peak.total();
    if (worst_peak != out.peak.total()) out.worst_routing_peak_bytes = worst_peak;
  }
  return out;
}

}  // namespace fsdp::plan
