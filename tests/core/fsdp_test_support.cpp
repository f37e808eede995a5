#include "fsdp_test_support.h"

#include <gtest/gtest.h>

#include "../distributed/dist_test_world.h"
#include "fsdp/core/grad_norm.h"
#include "fsdp/core/grad_scaler.h"
#include "fsdp/core/memory.h"
#include "fsdp/common/host_buffer.h"
#include "fsdp/optim/fused_adamw.h"

namespace fsdp::testing {
namespace {

// Parameter groups decided on the unsharded model, by name and dimension,
// as a trainer would; identities survive sharding, so the lists stay valid.
std::vector<torch::optim::OptimizerParamGroup> param_groups(TinyTransformer& model, double weight_decay) {
  std::vector<torch::Tensor> decay, no_decay;
  std::set<const void*> seen;
  for (const auto& item : model->named_parameters()) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    (item.value().dim() >= 2 ? decay : no_decay).push_back(item.value());
  }
  auto with_decay = std::make_unique<torch::optim::AdamWOptions>(1e-2);
  with_decay->weight_decay(weight_decay);
  auto without = std::make_unique<torch::optim::AdamWOptions>(1e-2);
  without->weight_decay(0.0);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::move(with_decay));
  groups.emplace_back(no_decay, std::move(without));
  return groups;
}

torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                              targets.reshape({-1}));
}

std::map<std::pair<int, int>, std::shared_ptr<dist::DeviceMesh>>& mesh_cache() {
  static std::map<std::pair<int, int>, std::shared_ptr<dist::DeviceMesh>> cache;
  return cache;
}
}  // namespace

std::shared_ptr<dist::DeviceMesh> mesh_for(ShardingStrategy strategy) {
  auto world = test_world_ptr();
  const int f = strategy == ShardingStrategy::kHybridShard ? hybrid_fsdp_size(world->size()) : 0;
  const int kind = strategy == ShardingStrategy::kNoShard ? 1 : strategy == ShardingStrategy::kHybridShard ? 2 : 0;
  auto& slot = mesh_cache()[{kind, f}];
  if (!slot) slot = std::make_shared<dist::DeviceMesh>(make_mesh(world, strategy, f));
  return slot;
}

TinyConfig tiny_config() { return TinyConfig{}; }

torch::Tensor global_batch(int step, int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7919 * step + 1);
  const auto c = tiny_config();
  return torch::randint(0, c.vocab, {rows, c.seq + 1}, gen, torch::TensorOptions().dtype(torch::kLong));
}

int hybrid_fsdp_size(int world) {
  if (world == 4) return 2;
  if (world == 2) return 1;
  return 0;
}

NamedTensors train_sharded(const RunSpec& spec, ShardedRunLog* log) {
  auto& world = test_world();
  const int w = world.size();
  const int rank = world.rank();
  auto model = make_tiny(tiny_config(), kInitSeed);
  auto groups = param_groups(model, spec.weight_decay);

  FullyShardOptions options;
  options.mesh = mesh_for(spec.strategy);
  options.strategy = spec.strategy;
  options.prefetch_depth = spec.prefetch_depth;
  options.offload = spec.offload;
  if (spec.compute_dtype != torch::kFloat) {
    options.mixed_precision.param_dtype = spec.compute_dtype;
    options.mixed_precision.reduce_dtype = torch::kFloat;
  }
  for (auto& block : model->blocks) fully_shard(block, options);
  fully_shard(model, options);
  if (spec.explicit_prefetch) {
    auto& b = model->blocks;
    for (size_t i = 0; i + 1 < b.size(); ++i) set_modules_to_forward_prefetch(*b[i], {b[i + 1].get()});
    for (size_t i = 1; i < b.size(); ++i) set_modules_to_backward_prefetch(*b[i], {b[i - 1].get()});
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer_owner;
  if (spec.fused_adamw || spec.optimizer_offload) {
    auto fused = std::make_unique<optim::FusedAdamW>(std::move(groups), torch::optim::AdamWOptions(1e-2));
    fused->set_state_offload(spec.optimizer_offload);
    optimizer_owner = std::move(fused);
  } else {
    optimizer_owner = std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(1e-2));
  }
  torch::optim::Optimizer& optimizer = *optimizer_owner;
  ShardedGradScaler scaler(world.group(), GradScalerOptions{kLossScale, 2.0, 0.5, 1000});

  // Data order: micro-step a of rank r reads rows [(a * W + r) * B, ... + B).
  const int64_t B = spec.rows_per_rank;
  for (int step = 0; step < spec.steps; ++step) {
    const torch::Tensor batch = global_batch(step, B * w * spec.grad_accum);
    for (int a = 0; a < spec.grad_accum; ++a) {
      set_requires_gradient_sync(*model, spec.sync_each_micro_step || a == spec.grad_accum - 1);
      const torch::Tensor rows = batch.narrow(0, (a * w + rank) * B, B);
      const auto c = tiny_config();
      torch::Tensor logits = fsdp::call(model, rows.narrow(1, 0, c.seq));
      torch::Tensor loss = loss_of(logits, rows.narrow(1, 1, c.seq)) / spec.grad_accum;
      (spec.loss_scaling ? scaler.scale(loss) : loss).backward();
    }
    if (spec.loss_scaling) scaler.unscale_(optimizer);
    const double norm = clip_grad_norm_(*model, spec.clip);
    if (spec.loss_scaling) {
      scaler.step(optimizer);
      scaler.update();
    } else {
      optimizer.step();
    }
    // Before zero_grad: LibTorch 1.13's zero_grad() zeroes gradients, 2.x's
    // sets them to none, and the state counted includes them.
    if (log != nullptr && step == 0) {
      const auto stats = memory_stats(*model, &optimizer);
      log->state_bytes_after_first_step = stats.sharded_param_bytes + stats.grad_bytes + stats.optimizer_state_bytes;
      log->stats_after_first_step = stats;
    }
    optimizer.zero_grad();
    if (log != nullptr) {
      log->grad_norms.push_back(norm);
      log->gathered_after_step.push_back(memory::gathered_bytes());
      log->loss_scales.push_back(scaler.get_scale());
    }
  }
  if (log != nullptr) {
    log->params_on_host = true;
    for (const auto& p : model->parameters()) {
      log->params_on_host = log->params_on_host && memory::is_host_buffer(p);
      log->any_param_on_host = log->any_param_on_host || memory::is_host_buffer(p);
    }
  }
  return full_parameters(*model);
}

NamedTensors train_reference(const RunSpec& spec, std::vector<double>* grad_norms) {
  // One process, the whole global batch, plain LibTorch. With bf16 or fp16,
  // mixed precision is done by hand the classic way: fp32 master weights
  // that the optimizer updates, copied into a low-precision model for
  // forward and backward, whose gradients are widened to fp32.
  auto model = make_tiny(tiny_config(), kInitSeed);
  torch::optim::AdamW optimizer(param_groups(model, spec.weight_decay), torch::optim::AdamWOptions(1e-2));
  const auto master = unique_parameters(*model);  // the optimizer's tensors
  const bool mixed = spec.compute_dtype != torch::kFloat;
  TinyTransformer compute = mixed ? make_tiny(tiny_config(), kInitSeed) : model;
  if (mixed) compute->to(spec.compute_dtype);
  const auto compute_params = unique_parameters(*compute);

  const int w = test_world().size();
  const int64_t rows_total = spec.rows_per_rank * w * spec.grad_accum;
  const auto c = tiny_config();
  for (int step = 0; step < spec.steps; ++step) {
    if (mixed) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < master.size(); ++i) compute_params[i].copy_(master[i]);
    }
    const torch::Tensor batch = global_batch(step, rows_total);
    if (!mixed) {
      torch::Tensor logits = compute->forward(batch.narrow(1, 0, c.seq));
      loss_of(logits, batch.narrow(1, 1, c.seq)).backward();
    } else {
      // bf16 gradients depend on how the batch is split (each backward
      // rounds its sums to bf16), so replay each rank's rows separately and
      // average the widened gradients in fp32, as data parallelism does.
      for (const auto& p : master) p.mutable_grad() = torch::zeros_like(p);
      const int64_t B = spec.rows_per_rank;
      for (int r = 0; r < w; ++r) {
        for (int a = 0; a < spec.grad_accum; ++a) {
          const torch::Tensor rows = batch.narrow(0, (a * w + r) * B, B);
          torch::Tensor logits = compute->forward(rows.narrow(1, 0, c.seq));
          const double scale = spec.loss_scaling ? kLossScale : 1.0;
          (loss_of(logits, rows.narrow(1, 1, c.seq)) * scale).backward();
          for (size_t i = 0; i < master.size(); ++i) {
            master[i].mutable_grad().add_(compute_params[i].grad().to(torch::kFloat).div_(scale));
            compute_params[i].mutable_grad() = torch::Tensor();
          }
        }
      }
      for (const auto& p : master) p.mutable_grad().div_(w * spec.grad_accum);
    }
    double sq = 0;
    for (const auto& p : master) sq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
    const double norm = std::sqrt(sq);
    if (spec.clip > 0 && norm > spec.clip) {
      for (const auto& p : master) p.grad().mul_(spec.clip / (norm + 1e-6));
    }
    if (grad_norms != nullptr) grad_norms->push_back(norm);
    optimizer.step();
    optimizer.zero_grad();
  }
  NamedTensors out;
  std::set<const void*> seen;
  for (const auto& item : model->named_parameters()) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) out.emplace_back(item.key(), item.value().detach());
  }
  return out;
}

double max_relative_difference(const NamedTensors& actual, const NamedTensors& expected, std::string* worst_name) {
  EXPECT_EQ(actual.size(), expected.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(actual.size(), expected.size()); ++i) {
    EXPECT_EQ(actual[i].first, expected[i].first);
    EXPECT_EQ(actual[i].second.sizes(), expected[i].second.sizes()) << actual[i].first;
    if (actual[i].second.sizes() != expected[i].second.sizes()) continue;
    const torch::Tensor e = expected[i].second.to(torch::kDouble);
    const double rel = (actual[i].second.to(torch::kDouble) - e).norm().item<double>() /
                       std::max(e.norm().item<double>(), 1e-12);
    if (rel > worst) {
      worst = rel;
      if (worst_name != nullptr) *worst_name = actual[i].first;
    }
  }
  return worst;
}

}  // namespace fsdp::testing
