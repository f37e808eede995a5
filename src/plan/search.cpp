#include "fsdp/plan/search.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <tuple>

#include "fsdp/common/error.h"
#include "fsdp/core/shard_layout.h"

namespace fsdp::plan {
namespace {

// Collectives per step, least first: replicas all-reduce once; keeping
// units gathered through backward saves their second all-gather.
int communication_rank(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kNoShard:
      return 0;
    case ShardingStrategy::kShardGradOp:
      return 1;
    case ShardingStrategy::kHybridShard:
      return 2;
    default:
      return 3;
  }
}

// Host traffic per step, least first: none, the optimizer's (parameters
// and gradients to the host and back once per step), or every gather's
// and reduction's too (CPU offload).
int offload_rank(const train::TrainConfig& j) { return j.fsdp.cpu_offload ? 2 : j.fsdp.optimizer_offload ? 1 : 0; }

// Smaller is preferred. Offload comes last of all: it moves the state over
// the host's link every step, which costs more than recomputing blocks.
auto preference(const Candidate& c) {
  const auto& j = c.job;
  return std::make_tuple(!c.fits, offload_rank(j), j.model.activation_checkpoint, -j.data.batch_size, j.model.chunk_loss,
                         communication_rank(j.fsdp.sharding), -j.fsdp.fsdp_size, -j.fsdp.prefetch_depth);
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

}  // namespace

int64_t with_headroom(int64_t tensor_bytes, double headroom) {
  // Tensors stay below 10^18 (predict's bound); the sum is kept far from
  // int64's limit however large the headroom.
  const long double total = static_cast<long double>(tensor_bytes) * (1 + static_cast<long double>(headroom));
  return total < 4e18L ? static_cast<int64_t>(total) : int64_t{4'000'000'000'000'000'000};
}

std::string format_bytes(int64_t bytes) {
  char text[32];
  const double b = static_cast<double>(bytes);
  if (b >= (1LL << 30)) {
    std::snprintf(text, sizeof(text), "%.2f GiB", b / (1LL << 30));
  } else {
    std::snprintf(text, sizeof(text), "%.1f MiB", b / (1LL << 20));
  }
  return text;
}

Choice choose(const ModelShape& model, const train::TrainConfig& job, int world, const Target& target,
              int64_t budget_bytes, int64_t overhead_bytes, double headroom) {
  std::vector<std::pair<ShardingStrategy, int64_t>> meshes = {{ShardingStrategy::kFullShard, 0}};
  if (world > 1) {
    meshes.push_back({ShardingStrategy::kShardGradOp, 0});
    meshes.push_back({ShardingStrategy::kNoShard, 0});
    for (int64_t f : divisors(world)) {
      if (f > 1 && f < world) meshes.push_back({ShardingStrategy::kHybridShard, f});
    }
  } else {
    meshes.push_back({ShardingStrategy::kNoShard, 0});
  }
  const int64_t sequences = job.data.batch_size * job.data.grad_accum;  // per rank per step, kept
  std::vector<int64_t> depths = {job.fsdp.prefetch_depth};
  for (int64_t d : {int64_t{1}, int64_t{0}}) {
    if (std::find(depths.begin(), depths.end(), d) == depths.end()) depths.push_back(d);
  }
  Choice choice;
  std::vector<std::vector<Candidate>> groups;
  for (const auto& [sharding, fsdp_size] : meshes) {
    for (int offload : {0, 1, 2}) {
      // Under torchtitan's selective checkpointing (Target) the job's own
      // setting is not used: one value suffices.
      for (bool ac : target.selective_checkpointing ? std::vector<bool>{false} : std::vector<bool>{false, true}) {
        // The chunked loss is the CPU kernel's; elsewhere lm_loss runs.
        for (bool chunk : target.composite_loss ? std::vector<bool>{false} : std::vector<bool>{false, true}) {
          std::vector<Candidate> group;
          for (int64_t depth : depths) {
            for (int64_t micro : divisors(sequences)) {
              Candidate c{job};
              c.job.fsdp.sharding = sharding;
              c.job.fsdp.fsdp_size = fsdp_size;
              c.job.fsdp.prefetch_depth = depth;
              c.job.fsdp.optimizer_offload = offload == 1;
              c.job.fsdp.cpu_offload = offload == 2;
              c.job.model.activation_checkpoint = ac;
              c.job.model.chunk_loss = chunk;
              c.job.data.batch_size = micro;
              c.job.data.grad_accum = sequences / micro;
              // The job's --reshard-after-forward where it divides this mesh's shard group.
              const int64_t keep_over = c.job.fsdp.reshard_after_forward;
              if (!reshard_ranks_fit(keep_over, shard_group_size(c.job, world))) c.job.fsdp.reshard_after_forward = 0;
              try {
                c.peak_bytes =
                    with_headroom(predict(model, c.job, world, target).peak.total(), headroom) + overhead_bytes;
                c.fits = c.peak_bytes <= budget_bytes;
              } catch (const Error&) {
                c.peak_bytes = std::numeric_limits<int64_t>::max();  // too large to plan: never fits
                c.fits = false;
              }
              if (choice.smallest.peak_bytes == 0 || c.peak_bytes < choice.smallest.peak_bytes) choice.smallest = c;
              group.push_back(std::move(c));
            }
          }
          const bool any_fits = std::any_of(group.begin(), group.end(), [](const Candidate& c) { return c.fits; });
          const auto best = std::min_element(group.begin(), group.end(), [&](const Candidate& a, const Candidate& b) {
            return any_fits ? preference(a) < preference(b) : a.peak_bytes < b.peak_bytes;
          });
          choice.groups.push_back(*best);
        }
      }
    }
  }
  std::stable_sort(choice.groups.begin(), choice.groups.end(),
                   [](const Candidate& a, const Candidate& b) { return preference(a) < preference(b); });
  if (!choice.groups.empty() && choice.groups.front().fits) choice.best = choice.groups.front();
  return choice;
}

std::string why_not(const Candidate& other, const Candidate& best, int64_t budget_bytes) {
  if (!other.fits) return "over the budget by " + format_bytes(other.peak_bytes - budget_bytes);
  const auto &o = other.job, &b = best.job;
  if (offload_rank(o) != offload_rank(b)) return "offloads to the host (host copies every step)";
  if (o.model.activation_checkpoint != b.model.activation_checkpoint) return "recomputes every block in backward";
  if (o.data.batch_size != b.data.batch_size) {
    return "fits only with micro-batch " + std::to_string(o.data.batch_size) + " (more, smaller matmuls)";
  }
  if (o.model.chunk_loss != b.model.chunk_loss) return "recomputes the logits in backward (chunked loss)";
  if (communication_rank(o.fsdp.sharding) != communication_rank(b.fsdp.sharding) ||
      o.fsdp.fsdp_size != b.fsdp.fsdp_size) {
    return "communicates more per step";
  }
  return "prefetches less";
}

std::string train_flags(const train::TrainConfig& job) {
  std::string flags = std::string("--sharding ") + to_string(job.fsdp.sharding);
  if (job.fsdp.sharding == ShardingStrategy::kHybridShard) flags += " --fsdp-size " + std::to_string(job.fsdp.fsdp_size);
  flags += " --batch-size " + std::to_string(job.data.batch_size) + " --grad-accum " +
           std::to_string(job.data.grad_accum) + " --seq-len " + std::to_string(job.data.seq_len) + " --precision " +
           train::name_of(job.runtime.precision) + " --prefetch-depth " + std::to_string(job.fsdp.prefetch_depth);
  if (job.data.grad_accum > 1 && job.fsdp.accumulate == train::Accumulate::kSharded) flags += " --accumulate sharded";
  if (job.fsdp.reshard_after_forward > 0) {
    flags += " --reshard-after-forward " + std::to_string(job.fsdp.reshard_after_forward);
  }
  if (job.model.activation_checkpoint) flags += " --activation-checkpoint";
  if (job.model.chunk_loss) flags += " --chunk-loss";
  if (job.fsdp.cpu_offload) flags += " --cpu-offload";
  if (job.fsdp.optimizer_offload) flags += " --optimizer-offload";
  return flags;
}

}  // namespace fsdp::plan
