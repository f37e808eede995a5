#include "fsdp/bench/step_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "fsdp/common/compat.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/models/example/model.h"
#include "fsdp/optim/fused_adamw.h"

namespace fsdp::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Stats {
  double median, min, max;
};

Stats stats_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

// One AdamW step of `model` on `tokens`; returns seconds.
template <typename Model>
double timed_step(Model& model, torch::optim::Optimizer& optimizer, const torch::Tensor& tokens, int64_t T) {
  const auto start = Clock::now();
  torch::Tensor logits = fsdp::call(model, tokens.narrow(1, 0, T));
  torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), tokens.narrow(1, 1, T).reshape({-1}))
      .backward();
  optimizer.step();
  compat::zero_grad_to_none(optimizer);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

StepBenchResult run_step_bench(const std::shared_ptr<dist::World>& world, const StepBenchOptions& o,
                               std::ostream* out) {
  models::ExampleTransformerConfig config;
  config.vocab_size = o.vocab_size;
  config.max_seq_len = o.seq_len;
  config.dim = o.dim;
  config.n_layers = o.n_layers;
  config.n_heads = o.n_heads;
  const int w = world->size();
  const bool compare = w == 1;
  // Subnormals flushed, as `fsdp train` does by default and the peer does
  // (torch.set_flush_denormal): AdamW's tiny values otherwise slow every op.
  at::globalContext().setFlushDenormal(true);

  torch::manual_seed(0);
  models::ExampleTransformer sharded(config);
  FullyShardOptions fsdp_options;
  fsdp_options.mesh = std::make_shared<dist::DeviceMesh>(make_mesh(world, o.strategy, 1));
  fsdp_options.strategy = o.strategy;
  for (auto& block : sharded->blocks) fully_shard(block, fsdp_options);
  fully_shard(sharded, fsdp_options);
  // The project's fused AdamW on both sides, as the trainer runs it: the
  // peer's is PyTorch's fused one, and the difference measured is FSDP's.
  optim::FusedAdamW sharded_optim(sharded->parameters(), torch::optim::AdamWOptions(1e-4));

  torch::manual_seed(0);
  models::ExampleTransformer plain(compare ? config : models::ExampleTransformerConfig{});
  optim::FusedAdamW plain_optim(plain->parameters(), torch::optim::AdamWOptions(1e-4));

  auto gen = at::make_generator<at::CPUGeneratorImpl>(world->rank());
  const torch::Tensor tokens =
      torch::randint(0, o.vocab_size, {o.batch_size, o.seq_len + 1}, gen, torch::TensorOptions().dtype(torch::kLong));

  std::vector<double> sharded_times, plain_times;
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    // A B A B ...: both sides see the same machine state on average.
    const double a = compare ? timed_step(plain, plain_optim, tokens, o.seq_len) : 0;
    dist::barrier(world->group());
    const double b = timed_step(sharded, sharded_optim, tokens, o.seq_len);
    if (i < o.warmup) continue;
    plain_times.push_back(a);
    sharded_times.push_back(b);
  }
  // The slowest rank sets the pace.
  at::Tensor slowest = at::tensor(sharded_times, at::kDouble);
  dist::all_reduce(world->group(), slowest, dist::ReduceOp::kMax).wait();
  const auto s = stats_of(std::vector<double>(slowest.data_ptr<double>(), slowest.data_ptr<double>() + slowest.numel()));
  StepBenchResult result;
  result.sharded_median_s = s.median;
  result.sharded_min_s = s.min;
  result.sharded_max_s = s.max;
  result.tokens_per_s = static_cast<double>(o.batch_size * o.seq_len * w) / s.median;
  if (compare) {
    const auto p = stats_of(plain_times);
    result.unsharded_median_s = p.median;
    result.unsharded_min_s = p.min;
    result.unsharded_max_s = p.max;
  }
  if (out != nullptr && world->rank() == 0) {
    char line[256];
    int64_t params = 0;
    for (const auto& p : plain->parameters()) params += p.numel();
    *out << "# example transformer: vocab " << o.vocab_size << ", dim " << o.dim << ", " << o.n_layers
         << " layers, " << o.n_heads << " heads; batch " << o.batch_size << " x seq " << o.seq_len << "; " << w
         << " rank(s), " << at::get_num_threads() << " thread(s) each; " << o.iters << " timed steps after "
         << o.warmup << " warm-up\n";
    std::snprintf(line, sizeof(line), "%-22s %10s %10s %10s %12s\n", "step", "median s", "min s", "max s", "tokens/s");
    *out << line;
    if (compare) {
      std::snprintf(line, sizeof(line), "%-22s %10.3f %10.3f %10.3f %12.0f\n", "unsharded (LibTorch)",
                    result.unsharded_median_s, result.unsharded_min_s, result.unsharded_max_s,
                    static_cast<double>(o.batch_size * o.seq_len) / result.unsharded_median_s);
      *out << line;
    }
    std::snprintf(line, sizeof(line), "%-22s %10.3f %10.3f %10.3f %12.0f\n",
                  (std::string("fsdp ") + to_string(o.strategy)).c_str(), s.median, s.min, s.max, result.tokens_per_s);
    *out << line;
    if (compare) {
      std::snprintf(line, sizeof(line), "fsdp overhead at W=1: %+.1f%% (median over median)\n",
                    100.0 * (result.sharded_median_s / result.unsharded_median_s - 1));
      *out << line;
    }
  }
  return result;
}

}  // namespace fsdp::bench
