// FSDP2's guarantees off the happy path, each against one process running
// the same global batch: frozen parameters (LoRA-style and whole units), a
// block applied twice, two forwards before one backward, exceptions in
// forward and backward, a parameter unused in some steps, a no-grad
// forward between backward and the optimizer step, and units recomputed
// more than once in one backward (activation checkpointing); and the same
// paths for a module replicated by fsdp::replicate (DDP).

#include <iterator>
#include <set>
#include <tuple>

#include <gtest/gtest.h>

#include "../distributed/dist_test_world.h"
#include "adapter_net.h"
#include "fsdp/common/compat.h"
#include "fsdp/common/error.h"
#include "fsdp/core/memory.h"
#include "fsdp/core/replicate.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp_test_support.h"

namespace fsdp::testing::fsdp_off_path_test {
namespace {

constexpr double kTolerance = 1e-5;
constexpr int64_t kRowsPerRank = 3;

// The dtypes of a model's parameters.
enum class Dtypes {
  kFp32,
  kFp64Matrices,    // fp64 linear layers beside fp32 norms and gates, all trained, each reduced in its own dtype
  kBf16Matrices,    // bf16 linear layers beside fp32 norms and gates, all trained, reduced in fp32
  kBf16FrozenBase,  // bf16 linear layers and fp32 norms frozen, fp32 adapters the only trainable ones
};

// Where gradients are cleared each step, and how.
enum class ZeroGrad {
  kAfterStep,               // set to none after the optimizer step
  kAfterForwardToNone,      // after the first forward, before its backward: set to none (2.x's zero_grad())
  kAfterForwardInPlace,     // ... zeroed in place (zero_grad(false), 1.13's zero_grad())
  kAfterForwardOptimizer,   // ... the optimizer's own zero_grad(), whichever this LibTorch does
  kAfterForwardModule,      // ... the module's zero_grad(false): zeroed in place, each gradient a new tensor
};

struct Scenario {
  AdapterNetConfig net;
  ZeroGrad zero_grad = ZeroGrad::kAfterStep;
  bool head_penalty = false;       // the loss adds a penalty on the root's head, computed after the forward
  Dtypes dtypes = Dtypes::kFp32;
  double tolerance = kTolerance;   // on the final parameters' relative difference
  int reshard_to = 0;              // > 0: reshard_after_forward = this many ranks
  bool freeze_bases = false;
  int frozen_block = -1;
  int unfreeze_at_step = -1;       // the frozen block becomes trainable from this step on
  bool bf16 = false;
  int forwards_per_step = 1;       // 2: two forwards, their losses summed, one backward
  int throw_forward_step = -1;     // block 1 throws in this step's forward
  int throw_backward_step = -1;    // ... or in its backward
  bool gate_on_even_steps = false; // the gates are used on even steps only
  bool eval_before_step = false;   // a no-grad forward between backward and the optimizer step
  bool dropped_forward_before_step = false;  // ... or one with gradients whose result is dropped
  bool graphless_forward_before_step = false;  // ... or one with gradients whose root returns no graph
  int micro_steps = 1;             // gradient accumulation, synchronised on the last micro-step only
  int skip_block_on_odd_steps = -1;  // a block not run on odd steps
  int prefetch_depth = 1;
  bool prefetch_skipped_explicitly = false;  // its neighbours name it in explicit prefetch lists
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  bool nest_base = false;          // each block's base projection is a unit of its own, inside the block's
  bool replicated = false;         // fsdp::replicate (DDP) instead of fully_shard
  int steps = 5;
};

struct RunLog {
  std::vector<torch::Tensor> eval_outputs;      // one per step, when eval_before_step
  std::vector<bool> gate_grad_defined;          // after each backward, block 0's gate
  std::vector<FSDPEvent> last_step_events;
  std::vector<ReplicateStats> replicate_stats;  // after each step, replicated runs
};

torch::Tensor inputs_of(int step, int forward, int64_t rows, int64_t dim) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * step + forward + 1);
  return torch::randn({rows, dim}, gen);
}
torch::Tensor targets_of(int step, int forward, int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5000 * step + forward + 7);
  return torch::randn({rows, 2}, gen);
}

AdapterNet build(const Scenario& s) {
  auto net = make_adapter_net(s.net, kInitSeed);
  if (s.dtypes == Dtypes::kFp64Matrices) net->linears_to(torch::kDouble, /*adapters_too=*/true);
  if (s.dtypes == Dtypes::kBf16Matrices) net->linears_to(torch::kBFloat16, /*adapters_too=*/true);
  if (s.dtypes == Dtypes::kBf16FrozenBase) {
    net->linears_to(torch::kBFloat16, /*adapters_too=*/false);
    net->freeze_all_but_adapters();
  }
  if (s.freeze_bases) net->freeze_bases();
  if (s.frozen_block >= 0) net->freeze_block(static_cast<size_t>(s.frozen_block));
  return net;
}

std::vector<torch::Tensor> trainable(torch::nn::Module& m, const Scenario& s) {
  if (s.unfreeze_at_step >= 0) return unique_parameters(m);  // the optimizer skips those without gradients
  std::vector<torch::Tensor> out;
  for (const auto& p : unique_parameters(m)) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

void set_grads_to_none(torch::nn::Module& m) {
  for (auto& p : unique_parameters(m)) p.mutable_grad() = torch::Tensor();
}

// Clears gradients as `how` says, as LibTorch's Optimizer::zero_grad does.
void zero_grads(torch::nn::Module& m, torch::optim::Optimizer& optimizer, ZeroGrad how) {
  if (how == ZeroGrad::kAfterForwardOptimizer) {
    optimizer.zero_grad();
    return;
  }
  if (how == ZeroGrad::kAfterForwardModule) {
    m.zero_grad(/*set_to_none=*/false);
    return;
  }
  for (auto& p : unique_parameters(m)) {
    if (!p.grad().defined()) continue;
    p.mutable_grad().detach_();
    if (how == ZeroGrad::kAfterForwardInPlace) {
      p.mutable_grad().zero_();
    } else {
      p.mutable_grad() = torch::Tensor();
    }
  }
}


NamedTensors named(torch::nn::Module& m) {
  NamedTensors out;
  std::set<const void*> seen;
  for (const auto& item : m.named_parameters()) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) out.emplace_back(item.key(), item.value().detach().clone());
  }
  return out;
}

NamedTensors train_sharded(const Scenario& s, RunLog* log) {
  const int w = test_world().size();
  const int rank = test_world().rank();
  auto net = build(s);
  FullyShardOptions options;
  options.mesh = mesh_for(s.strategy);
  options.strategy = s.strategy;
  if (s.bf16) {
    options.mixed_precision.param_dtype = torch::kBFloat16;
    options.mixed_precision.reduce_dtype = torch::kFloat;
  }
  if (s.dtypes == Dtypes::kBf16Matrices) options.mixed_precision.reduce_dtype = torch::kFloat;
  if (s.reshard_to > 0) options.reshard_after_forward = s.reshard_to;
  options.prefetch_depth = s.prefetch_depth;
  if (s.replicated) {
    // Buckets of about 2 KB: several per model, each a few parameters.
    ReplicateOptions replicate_options{test_world_ptr(), /*bucket_cap_mb=*/0.002};
    replicate_options.mixed_precision = options.mixed_precision;
    replicate(net, replicate_options);
  } else {
    for (auto& b : net->blocks) {
      if (s.nest_base) fully_shard(b->base, options);
      fully_shard(b, options);
    }
    fully_shard(net, options);
  }
  if (s.prefetch_skipped_explicitly) {
    const auto k = static_cast<size_t>(s.skip_block_on_odd_steps);
    set_modules_to_forward_prefetch(*net->blocks[k - 1], {net->blocks[k].get()});
    set_modules_to_backward_prefetch(*net->blocks[k + 1], {net->blocks[k].get()});
  }
  torch::optim::AdamW optimizer(trainable(*net, s), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  const int64_t rows = kRowsPerRank * w;
  for (int step = 0; step < s.steps; ++step) {
    if (step == s.unfreeze_at_step) {
      for (auto& p : net->blocks[static_cast<size_t>(s.frozen_block)]->parameters()) p.set_requires_grad(true);
    }
    for (auto& b : net->blocks) b->use_gate = !s.gate_on_even_steps || step % 2 == 0;
    net->skipped_block = step % 2 == 1 ? s.skip_block_on_odd_steps : -1;
    if (log != nullptr && !s.replicated) clear_event_log(*net);
    const bool fail_forward = step == s.throw_forward_step;
    const bool fail_backward = step == s.throw_backward_step;
    net->blocks[1]->throw_in_forward = fail_forward;
    net->blocks[1]->throw_in_backward = fail_backward;
    try {
      for (int m = 0; m < s.micro_steps; ++m) {
        set_requires_gradient_sync(*net, m == s.micro_steps - 1);
        torch::Tensor loss = torch::zeros({});
        for (int f = 0; f < s.forwards_per_step; ++f) {
          const int batch = f + 10 * m;
          torch::Tensor x = inputs_of(step, batch, rows, s.net.dim).narrow(0, rank * kRowsPerRank, kRowsPerRank);
          torch::Tensor y = targets_of(step, batch, rows).narrow(0, rank * kRowsPerRank, kRowsPerRank);
          loss = loss + torch::mse_loss(fsdp::call(net, x).to(torch::kFloat), y);
        }
        // The root is gathered: its head is whole until its backward.
        if (s.head_penalty) loss = loss + 0.1 * net->head->weight.pow(2).sum();
        // Between the forward and its backward: the root is gathered, and
        // the gradients of the last step wait aside in shard form.
        if (m == 0 && s.zero_grad != ZeroGrad::kAfterStep) zero_grads(*net, optimizer, s.zero_grad);
        (loss / s.micro_steps).backward();
      }
      EXPECT_FALSE(fail_forward || fail_backward) << "the injected failure did not surface";
    } catch (const std::exception& e) {
      EXPECT_TRUE(fail_forward || fail_backward) << e.what();
      EXPECT_NE(std::string(e.what()).find("injected failure"), std::string::npos) << e.what();
      net->blocks[1]->throw_in_forward = false;
      net->blocks[1]->throw_in_backward = false;
      EXPECT_EQ(memory::gathered_bytes(), 0) << "an error left units gathered";
      set_grads_to_none(*net);
      continue;  // the step is dropped, as in the reference
    }
    if (log != nullptr) log->gate_grad_defined.push_back(net->config.gate && net->blocks[0]->gate.grad().defined());
    if (s.eval_before_step) {
      torch::NoGradGuard no_grad;
      torch::Tensor out = fsdp::call(net, inputs_of(100 + step, 0, rows, s.net.dim));
      if (log != nullptr) log->eval_outputs.push_back(out.to(torch::kFloat));
    }
    if (s.dropped_forward_before_step) {
      // A metric computed without NoGradGuard: a graph built, never backwarded.
      torch::Tensor out = fsdp::call(net, inputs_of(100 + step, 0, rows, s.net.dim).narrow(0, rank * kRowsPerRank, kRowsPerRank));
      if (log != nullptr) log->eval_outputs.push_back(out.detach().to(torch::kFloat));
    }
    if (s.graphless_forward_before_step) {
      // Gradients on, the blocks' outputs need them, but what the root
      // returns has no graph (a detached metric): no backward can follow.
      torch::Tensor x = inputs_of(100 + step, 0, rows, s.net.dim).narrow(0, rank * kRowsPerRank, kRowsPerRank);
      torch::Tensor out = fsdp::run(net, [&] { return net->forward(x).detach(); });
      if (log != nullptr) log->eval_outputs.push_back(out.to(torch::kFloat));
    }
    optimizer.step();
    if (s.zero_grad == ZeroGrad::kAfterStep) set_grads_to_none(*net);
    EXPECT_EQ(memory::gathered_bytes(), 0) << "gathered buffers left after step " << step;
    if (log != nullptr && !s.replicated) log->last_step_events = event_log(*net);
    if (log != nullptr && s.replicated) log->replicate_stats.push_back(replicate_stats(*net));
  }
  return full_parameters(*net);
}

// One process: the whole global batch in fp32; under bf16, each rank's rows
// replayed through a bf16 copy and the widened gradients averaged in fp32;
// with bf16 parameters, each rank's rows replayed through the model itself,
// the widened gradients averaged in fp32 and handed over in each
// parameter's dtype. Without activation checkpointing: the same function,
// its activations kept.
NamedTensors train_reference(const Scenario& s, RunLog* log) {
  const int w = test_world().size();
  auto net = build(s);
  net->config.checkpoint = false;
  auto master = trainable(*net, s);
  torch::optim::AdamW optimizer(master, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  AdapterNet compute = s.bf16 ? build(s) : net;
  compute->config.checkpoint = false;
  if (s.bf16) compute->to(torch::kBFloat16);
  auto compute_params = trainable(*compute, s);
  const int64_t rows = kRowsPerRank * w;
  for (int step = 0; step < s.steps; ++step) {
    if (step == s.throw_forward_step || step == s.throw_backward_step) continue;
    if (step == s.unfreeze_at_step) {
      for (auto& p : net->blocks[static_cast<size_t>(s.frozen_block)]->parameters()) p.set_requires_grad(true);
    }
    for (auto& b : compute->blocks) b->use_gate = !s.gate_on_even_steps || step % 2 == 0;
    compute->skipped_block = step % 2 == 1 ? s.skip_block_on_odd_steps : -1;
    const bool replay = s.bf16 || s.dtypes != Dtypes::kFp32;
    if (!replay) {
      for (int m = 0; m < s.micro_steps; ++m) {
        torch::Tensor loss = torch::zeros({});
        for (int f = 0; f < s.forwards_per_step; ++f) {
          const int batch = f + 10 * m;
          loss = loss + torch::mse_loss(net->forward(inputs_of(step, batch, rows, s.net.dim)), targets_of(step, batch, rows));
        }
        if (s.head_penalty) loss = loss + 0.1 * net->head->weight.pow(2).sum();
        (loss / s.micro_steps).backward();
      }
    } else {
      FSDP_CHECK(s.micro_steps == 1, "the bf16 reference replays one micro-step");
      if (s.bf16) {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < master.size(); ++i) compute_params[i].copy_(master[i]);
      }
      std::vector<torch::Tensor> sums(master.size());
      // Widens the bf16 gradients of the parameters `take` selects into the
      // fp32 sums and clears them.
      const auto harvest = [&](const auto& take) {
        for (size_t i = 0; i < master.size(); ++i) {
          const torch::Tensor& g = compute_params[i].grad();
          if (!g.defined() || !take(i)) continue;
          const torch::Tensor wide = g.to(at::promote_types(g.scalar_type(), torch::kFloat));
          sums[i] = sums[i].defined() ? sums[i] + wide : wide;
          compute_params[i].mutable_grad() = torch::Tensor();
        }
      };
      // Under checkpointing each forward's blocks are gathered again in
      // backward and reduced on their own: their gradients are summed over
      // the forwards in fp32, where the root's (gathered once) add in bf16.
      std::set<const void*> block_params;
      if (s.net.checkpoint) {
        for (auto& b : compute->blocks) {
          for (const auto& p : b->parameters()) block_params.insert(p.unsafeGetTensorImpl());
        }
      }
      const auto is_block = [&](size_t i) { return block_params.count(compute_params[i].unsafeGetTensorImpl()) > 0; };
      for (int r = 0; r < w; ++r) {
        torch::Tensor loss = torch::zeros({});
        for (int f = 0; f < s.forwards_per_step; ++f) {
          torch::Tensor x = inputs_of(step, f, rows, s.net.dim).narrow(0, r * kRowsPerRank, kRowsPerRank);
          torch::Tensor y = targets_of(step, f, rows).narrow(0, r * kRowsPerRank, kRowsPerRank);
          if (s.bf16) x = x.to(torch::kBFloat16);
          torch::Tensor loss_f = torch::mse_loss(compute->forward(x).to(torch::kFloat), y);
          if (s.net.checkpoint) {
            loss_f.backward();
            harvest(is_block);
          } else {
            loss = loss + loss_f;
          }
        }
        if (!s.net.checkpoint) loss.backward();
        harvest([](size_t) { return true; });
      }
      for (size_t i = 0; i < master.size(); ++i) {
        if (sums[i].defined()) master[i].mutable_grad() = (sums[i] / w).to(master[i].scalar_type());
      }
    }
    if (log != nullptr) log->gate_grad_defined.push_back(net->config.gate && net->blocks[0]->gate.grad().defined());
    if (s.eval_before_step) {
      torch::NoGradGuard no_grad;
      if (s.bf16) {
        for (size_t i = 0; i < master.size(); ++i) compute_params[i].copy_(master[i]);
      }
      torch::Tensor x = inputs_of(100 + step, 0, rows, s.net.dim);
      torch::Tensor out = s.bf16 ? compute->forward(x.to(torch::kBFloat16)) : net->forward(x);
      if (log != nullptr) log->eval_outputs.push_back(out.to(torch::kFloat));
    }
    if (s.dropped_forward_before_step || s.graphless_forward_before_step) {
      // Each rank's rows through the plain model (its bf16 copy, under
      // bf16): the output each rank sees.
      const int rank = test_world().rank();
      torch::Tensor x = inputs_of(100 + step, 0, rows, s.net.dim).narrow(0, rank * kRowsPerRank, kRowsPerRank);
      torch::Tensor out;
      if (s.bf16) {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < master.size(); ++i) compute_params[i].copy_(master[i]);
        out = compute->forward(x.to(torch::kBFloat16));
      } else {
        out = net->forward(x);
      }
      if (log != nullptr) log->eval_outputs.push_back(out.detach().to(torch::kFloat));
    }
    optimizer.step();
    // Zeroing after the next forward is zeroing here, in one process.
    if (s.zero_grad == ZeroGrad::kAfterStep) {
      set_grads_to_none(*net);
    } else {
      zero_grads(*net, optimizer, s.zero_grad);
    }
  }
  return named(*net);
}

void expect_matches_reference(const Scenario& s, RunLog* sharded_log = nullptr, RunLog* reference_log = nullptr) {
  RunLog local_sharded, local_reference;
  if (sharded_log == nullptr) sharded_log = &local_sharded;
  if (reference_log == nullptr) reference_log = &local_reference;
  const auto sharded = train_sharded(s, sharded_log);
  const auto reference = train_reference(s, reference_log);
  std::string worst;
  const double diff = max_relative_difference(sharded, reference, &worst);
  EXPECT_LE(diff, s.tolerance) << "worst parameter: " << worst;
  // The reference's parameters moved: the comparison means something.
  const auto initial = named(*build(s));
  EXPECT_GT(max_relative_difference(reference, initial, nullptr), 1e-3) << "training changed nothing";
  ASSERT_EQ(sharded_log->eval_outputs.size(), reference_log->eval_outputs.size());
  for (size_t i = 0; i < sharded_log->eval_outputs.size(); ++i) {
    const auto& a = sharded_log->eval_outputs[i];
    const auto& b = reference_log->eval_outputs[i];
    EXPECT_LE((a - b).norm().item<double>() / b.norm().item<double>(), s.bf16 ? 1e-2 : kTolerance) << "eval " << i;
  }
}

TEST(OffPath, LoraStyleFrozenBaseWithTrainableAdapters) {
  Scenario s;
  s.net.adapters = true;
  s.freeze_bases = true;
  expect_matches_reference(s);
}

// Units holding parameters of two dtypes: one flat shard per dtype (see
// [Note: a unit of several dtypes]), every strategy.
class MixedDtypes : public ::testing::TestWithParam<ShardingStrategy> {
 protected:
  Scenario scenario(Dtypes dtypes) {
    Scenario s;
    s.strategy = GetParam();
    s.dtypes = dtypes;
    s.net.adapters = true;
    s.net.own_dtype_linears = true;
    return s;
  }
  bool runs_here() const {
    return GetParam() != ShardingStrategy::kHybridShard || hybrid_fsdp_size(test_world().size()) != 0;
  }
};

TEST_P(MixedDtypes, Fp32NormsBesideFp64MatricesMatchOneProcess) {
  if (!runs_here()) GTEST_SKIP();
  expect_matches_reference(scenario(Dtypes::kFp64Matrices));
}

TEST_P(MixedDtypes, Fp32NormsBesideBf16MatricesMatchOneProcess) {
  if (!runs_here()) GTEST_SKIP();
  Scenario s = scenario(Dtypes::kBf16Matrices);
  // The first step matches bit for bit at W = 2 (the gathers, the bf16
  // gradients and their fp32 average are exact); from the second, some
  // elements land one bf16 step (4e-3 of the element) apart: AdamW's bf16
  // arithmetic runs over each rank's 1-D slice instead of the whole
  // tensor, and at W = 3 and 4 the fp32 average sums in another order.
  // Measured at W = 2: 9e-5 after two steps, 3e-3 after five.
  // Training moves the parameters by about 0.2 of their norm; a misplaced
  // slice would move one by as much.
  s.tolerance = 1e-2;
  expect_matches_reference(s);
}

TEST_P(MixedDtypes, UnderABf16PolicyEveryDtypeComputesInBf16) {
  if (!runs_here()) GTEST_SKIP();
  Scenario s = scenario(Dtypes::kBf16Matrices);
  s.bf16 = true;  // param_dtype bf16 for the fp32 norms too; the reference computes all in bf16
  // bf16 matrices, as above, and the norms' biases, which start at zero,
  // relative to their own small norm: measured up to 1.2e-2 (W = 4,
  // LibTorch 1.13's bf16 kernels).
  s.tolerance = 3e-2;
  expect_matches_reference(s);
}

TEST_P(MixedDtypes, KeptOverFewerRanksAfterForwardEachDtypeGathersInsideItsGroup) {
  if (test_world().size() != 4 || GetParam() != ShardingStrategy::kFullShard) {
    GTEST_SKIP() << "a shard group with a divisor strictly between 1 and its size: full_shard at W = 4";
  }
  Scenario s = scenario(Dtypes::kFp64Matrices);
  s.reshard_to = 2;
  RunLog log;
  expect_matches_reference(s, &log);
  std::vector<int> ranks;
  for (const auto& e : log.last_step_events) {
    if (e.unit == "b0" && e.kind == FSDPEvent::Kind::kAllGather) ranks.push_back(e.ranks);
  }
  EXPECT_EQ(ranks, (std::vector<int>{4, 4, 2, 2})) << "forward over all 4 ranks, backward inside pairs, per dtype";
}

TEST_P(MixedDtypes, FrozenBf16BaseWithFp32AdaptersMatchesOneProcess) {
  if (!runs_here()) GTEST_SKIP();
  Scenario s = scenario(Dtypes::kBf16FrozenBase);
  // The adapters' gradients reach them through the bf16 base. With more
  // than two ranks their fp32 average sums in another order than the
  // reference's, which moves parameters by 1e-7 and flips the rounding of
  // some bf16 activations in the next step's forward: measured up to
  // 1.4e-4 (W = 4, 2 x 2 HSDP, LibTorch 1.13). Two terms sum exactly.
  if (test_world().size() > 2) s.tolerance = 1e-3;
  RunLog log;
  expect_matches_reference(s, &log);
  // The frozen bf16 base is gathered in every forward and backward and
  // never reduced: each block's reductions are its fp32 adapters' alone.
  const int shard_size = mesh_for(s.strategy)->shard_group().size();
  int gathers = 0, reductions = 0;
  for (const auto& e : log.last_step_events) {
    if (e.unit != "b0") continue;
    gathers += e.kind == FSDPEvent::Kind::kAllGather ? 1 : 0;
    reductions += e.kind == FSDPEvent::Kind::kReduceScatter ? 1 : 0;
  }
  if (shard_size > 1) {
    // Forward and backward (once under full_shard), each for both dtypes.
    EXPECT_EQ(gathers, s.strategy == ShardingStrategy::kShardGradOp ? 2 : 4);
    EXPECT_EQ(reductions, 1) << "only the adapters' dtype is reduced";
  }
}
INSTANTIATE_TEST_SUITE_P(Strategies, MixedDtypes,
                         ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(OffPath, FullyFrozenBlockReshardsPromptlyInBackward) {
  Scenario s;
  s.frozen_block = 1;
  RunLog log;
  expect_matches_reference(s, &log);
  // The frozen block is released in backward as soon as its inputs'
  // gradients exist, before the block below it starts its backward.
  int64_t released = -1, next_started = -1;
  for (const auto& e : log.last_step_events) {
    if (e.kind == FSDPEvent::Kind::kPostBackward && e.unit == "b1") released = e.sequence;
    if (e.kind == FSDPEvent::Kind::kPreBackward && e.unit == "b0") next_started = e.sequence;
  }
  ASSERT_GE(released, 0) << "no post-backward for the frozen block";
  ASSERT_GE(next_started, 0);
  EXPECT_LT(released, next_started);
}

// Test-name suffix for the precision parameter (true: bf16 compute).
std::string precision_name(const ::testing::TestParamInfo<bool>& info) { return info.param ? "bf16" : "fp32"; }

class AppliedTwice : public ::testing::TestWithParam<bool> {};
TEST_P(AppliedTwice, BlockAppliedTwiceInOneForward) {
  Scenario s;
  s.net.twice_block = 1;
  s.bf16 = GetParam();
  expect_matches_reference(s);
}
INSTANTIATE_TEST_SUITE_P(Precision, AppliedTwice, ::testing::Values(false, true),
                         precision_name);

class TwoForwards : public ::testing::TestWithParam<bool> {};
TEST_P(TwoForwards, TwoForwardsSummedIntoOneBackward) {
  Scenario s;
  s.forwards_per_step = 2;
  s.bf16 = GetParam();
  expect_matches_reference(s);
}
INSTANTIATE_TEST_SUITE_P(Precision, TwoForwards, ::testing::Values(false, true),
                         precision_name);

class Exceptions : public ::testing::TestWithParam<ShardingStrategy> {};
TEST_P(Exceptions, ThrownInForwardCaughtThenStepsMatch) {
  Scenario s;
  s.strategy = GetParam();
  if (s.strategy == ShardingStrategy::kHybridShard && hybrid_fsdp_size(test_world().size()) == 0) GTEST_SKIP();
  s.throw_forward_step = 1;
  expect_matches_reference(s);
}
TEST_P(Exceptions, ThrownInBackwardCaughtThenStepsMatch) {
  Scenario s;
  s.strategy = GetParam();
  if (s.strategy == ShardingStrategy::kHybridShard && hybrid_fsdp_size(test_world().size()) == 0) GTEST_SKIP();
  s.throw_backward_step = 1;
  expect_matches_reference(s);
}
INSTANTIATE_TEST_SUITE_P(Strategies, Exceptions,
                         ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kHybridShard),
                         [](const auto& info) { return std::string(to_string(info.param)); });

class ZeroGradAfterForward : public ::testing::TestWithParam<std::tuple<ShardingStrategy, ZeroGrad>> {};
TEST_P(ZeroGradAfterForward, ReachesTheGradientsSetAsideWhileGathered) {
  // The DCGAN example's order: forward, zero_grad, backward, step. The root
  // is gathered from its forward to its backward, and the last step's
  // sharded gradients wait aside meanwhile: the zero_grad must clear them,
  // as in one process, or every step adds the one before it. Gates are used
  // on even steps only: on odd steps nothing else clears theirs.
  Scenario s;
  s.strategy = std::get<0>(GetParam());
  if (s.strategy == ShardingStrategy::kHybridShard && hybrid_fsdp_size(test_world().size()) == 0) GTEST_SKIP();
  s.zero_grad = std::get<1>(GetParam());
  s.net.gate = true;
  s.gate_on_even_steps = true;
  RunLog sharded, reference;
  expect_matches_reference(s, &sharded, &reference);
  // Zeroed in place, the gates keep a (zero) gradient on odd steps; set to
  // none, they have none, as in one process with the same calls.
  const bool in_place = s.zero_grad == ZeroGrad::kAfterForwardInPlace || s.zero_grad == ZeroGrad::kAfterForwardModule ||
                        (s.zero_grad == ZeroGrad::kAfterForwardOptimizer && FSDP_TORCH_VERSION < 200);
  EXPECT_EQ(sharded.gate_grad_defined,
            in_place ? std::vector<bool>(5, true) : (std::vector<bool>{true, false, true, false, true}));
}
INSTANTIATE_TEST_SUITE_P(
    Strategies, ZeroGradAfterForward,
    ::testing::Combine(::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                         ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard),
                       ::testing::Values(ZeroGrad::kAfterForwardToNone, ZeroGrad::kAfterForwardInPlace,
                                         ZeroGrad::kAfterForwardOptimizer, ZeroGrad::kAfterForwardModule)),
    [](const auto& info) {
      const ZeroGrad how = std::get<1>(info.param);
      const char* name = how == ZeroGrad::kAfterForwardToNone    ? "to_none"
                         : how == ZeroGrad::kAfterForwardInPlace ? "in_place"
                         : how == ZeroGrad::kAfterForwardModule  ? "module"
                                                                 : "optimizer";
      return std::string(to_string(std::get<0>(info.param))) + "_" + name;
    });

TEST(OffPath, ZeroGradAfterForwardWithARootParameterUsedAfterTheForward) {
  // A parameter used again after its unit's forward (as a tied head is)
  // accumulates into the gathered gradient buffer, not into the stand-in.
  Scenario s;
  s.zero_grad = ZeroGrad::kAfterForwardToNone;
  s.head_penalty = true;
  expect_matches_reference(s);
  s.zero_grad = ZeroGrad::kAfterForwardInPlace;
  expect_matches_reference(s);
}

TEST(OffPath, ParameterUnusedInSomeStepsGetsNoGradient) {
  Scenario s;
  s.net.gate = true;
  s.gate_on_even_steps = true;
  RunLog sharded, reference;
  expect_matches_reference(s, &sharded, &reference);
  ASSERT_EQ(sharded.gate_grad_defined.size(), 5u);
  EXPECT_EQ(sharded.gate_grad_defined, reference.gate_grad_defined);
  EXPECT_EQ(sharded.gate_grad_defined, (std::vector<bool>{true, false, true, false, true}));
}

class EvalBetween : public ::testing::TestWithParam<ShardingStrategy> {};
TEST_P(EvalBetween, NoGradForwardBetweenBackwardAndStep) {
  Scenario s;
  s.strategy = GetParam();
  s.eval_before_step = true;
  RunLog sharded, reference;
  expect_matches_reference(s, &sharded, &reference);
  EXPECT_EQ(sharded.eval_outputs.size(), 5u);
}
INSTANTIATE_TEST_SUITE_P(Strategies, EvalBetween,
                         ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kNoShard),
                         [](const auto& info) { return std::string(to_string(info.param)); });

class DroppedForward : public ::testing::TestWithParam<ShardingStrategy> {};
TEST_P(DroppedForward, ForwardWithGradientsWhoseResultIsDroppedBeforeStep) {
  // Between backward and step, a forward with gradients enabled whose output
  // is never backwarded: the optimizer must see this step's gradients, and
  // the next backward must not add into stale ones.
  Scenario s;
  s.strategy = GetParam();
  if (s.strategy == ShardingStrategy::kHybridShard && hybrid_fsdp_size(test_world().size()) == 0) GTEST_SKIP();
  s.dropped_forward_before_step = true;
  RunLog sharded, reference;
  expect_matches_reference(s, &sharded, &reference);
  EXPECT_EQ(sharded.eval_outputs.size(), 5u);
}
INSTANTIATE_TEST_SUITE_P(Strategies, DroppedForward,
                         ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard),
                         [](const auto& info) { return std::string(to_string(info.param)); });

class GraphlessForward : public ::testing::TestWithParam<ShardingStrategy> {};
TEST_P(GraphlessForward, ForwardWithGradientsWhoseRootReturnsNoGraphBeforeStep) {
  // The root's outputs carry no graph, so the iteration that forward
  // opened ends with it: units kept gathered for a backward (shard_grad_op,
  // the root) are released before the step (the loop checks no gathered
  // bytes remain), and the step sees the backward's gradients.
  Scenario s;
  s.strategy = GetParam();
  if (s.strategy == ShardingStrategy::kHybridShard && hybrid_fsdp_size(test_world().size()) == 0) GTEST_SKIP();
  s.graphless_forward_before_step = true;
  RunLog sharded, reference;
  expect_matches_reference(s, &sharded, &reference);
  EXPECT_EQ(sharded.eval_outputs.size(), 5u);
}
INSTANTIATE_TEST_SUITE_P(Strategies, GraphlessForward,
                         ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard),
                         [](const auto& info) { return std::string(to_string(info.param)); });

class UnusedUnderAccumulation : public ::testing::TestWithParam<ShardingStrategy> {};
TEST_P(UnusedUnderAccumulation, ParameterNoMicroStepUsesKeepsNoGradient) {
  // Two micro-steps, synchronised on the second; the gates are used on even
  // steps only. On odd steps no micro-step uses them: their gradient stays
  // none, as in one process, so AdamW neither decays them nor moves their
  // moments.
  Scenario s;
  s.strategy = GetParam();
  if (s.strategy == ShardingStrategy::kHybridShard && hybrid_fsdp_size(test_world().size()) == 0) GTEST_SKIP();
  s.net.gate = true;
  s.gate_on_even_steps = true;
  s.micro_steps = 2;
  RunLog sharded, reference;
  expect_matches_reference(s, &sharded, &reference);
  EXPECT_EQ(sharded.gate_grad_defined, reference.gate_grad_defined);
  EXPECT_EQ(sharded.gate_grad_defined, (std::vector<bool>{true, false, true, false, true}));
}
INSTANTIATE_TEST_SUITE_P(Strategies, UnusedUnderAccumulation,
                         ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard),
                         [](const auto& info) { return std::string(to_string(info.param)); });

class UnfrozenLater : public ::testing::TestWithParam<ShardingStrategy> {};
TEST_P(UnfrozenLater, UnitFrozenWholeWhenShardedTrainsOnceUnfrozen) {
  // Block 1 is frozen as a whole when sharded and unfrozen from step 2 on:
  // from then on it gets gradients and trains, as in one process.
  Scenario s;
  s.strategy = GetParam();
  if (s.strategy == ShardingStrategy::kHybridShard && hybrid_fsdp_size(test_world().size()) == 0) GTEST_SKIP();
  s.frozen_block = 1;
  s.unfreeze_at_step = 2;
  expect_matches_reference(s);
}
INSTANTIATE_TEST_SUITE_P(Strategies, UnfrozenLater,
                         ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard),
                         [](const auto& info) { return std::string(to_string(info.param)); });

class UnusedPrefetch : public ::testing::TestWithParam<bool> {};
TEST_P(UnusedPrefetch, AGatherForAUnitThatDoesNotRunIsFinishedAndFreed) {
  // A frozen block skipped on odd steps, prefetched anyway (implicitly at
  // depth 2, or named in its neighbours' explicit lists): the gather is
  // finished and freed by the end of backward (nothing gathered at step()),
  // never consumed stale by a later forward, and training matches.
  Scenario s;
  s.frozen_block = 1;
  s.skip_block_on_odd_steps = 1;
  s.prefetch_depth = 2;
  s.prefetch_skipped_explicitly = GetParam();
  s.steps = 4;  // the last, step 3, skips block 1
  RunLog log;
  expect_matches_reference(s, &log);
  // On that step block 1 was gathered (the prefetch was issued) and never
  // ran its forward: the gather the test is about happened.
  int gathers = 0, pre_forwards = 0;
  for (const auto& e : log.last_step_events) {
    if (e.unit != "b1") continue;
    gathers += e.kind == FSDPEvent::Kind::kAllGather;
    pre_forwards += e.kind == FSDPEvent::Kind::kPreForward;
  }
  // One rank holds whole parameters: nothing to gather, at W = 1 only.
  if (test_world().size() > 1) {
    EXPECT_GE(gathers, 1) << "no all-gather of the skipped block: nothing prefetched it";
  }
  EXPECT_EQ(pre_forwards, 0) << "the skipped block ran";
}
INSTANTIATE_TEST_SUITE_P(Prefetch, UnusedPrefetch, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "explicit" : "depth2"); });

TEST(OffPath, SecondBackwardThroughARetainedGraphAccumulates) {
  // Twice through the same graph equals one backward of twice the loss.
  const int w = test_world().size();
  const int rank = test_world().rank();
  Scenario s;
  const int64_t rows = kRowsPerRank * w;
  torch::Tensor x = inputs_of(0, 0, rows, s.net.dim);
  torch::Tensor y = targets_of(0, 0, rows);
  auto net = build(s);
  FullyShardOptions options;
  options.mesh = mesh_for(ShardingStrategy::kFullShard);
  for (auto& b : net->blocks) fully_shard(b, options);
  fully_shard(net, options);
  torch::Tensor loss = torch::mse_loss(fsdp::call(net, x.narrow(0, rank * kRowsPerRank, kRowsPerRank)),
                                       y.narrow(0, rank * kRowsPerRank, kRowsPerRank));
  loss.backward({}, /*retain_graph=*/true);
  loss.backward();
  EXPECT_EQ(memory::gathered_bytes(), 0);
  // Reference: one process, one backward of 2 x loss; compare each rank's shards.
  auto ref = build(s);
  (2 * torch::mse_loss(ref->forward(x), y)).backward();
  std::map<std::string, torch::Tensor> expected;
  for (const auto& item : ref->named_parameters()) expected[item.key()] = item.value().grad().reshape({-1});
  for (const auto& shard : local_shards(*net)) {
    ASSERT_TRUE(shard.param.grad().defined()) << shard.fqn;
    const torch::Tensor want = expected.at(shard.fqn).narrow(0, shard.begin, shard.numel);
    EXPECT_TRUE(torch::allclose(shard.param.grad(), want, 1e-5, 1e-6)) << shard.fqn;
  }
}

// A unit used more than once in one backward. Under activation
// checkpointing each checkpointed region that called a unit recomputes it
// in backward, gathering it again: two forwards before one backward
// (DPO-style), one unit called in two regions of one forward, units nested
// inside a checkpointed block, and all of it under gradient accumulation.
// Each gathering in backward gets its own post-backward and reduction (see
// [Note: a unit used again in backward]); calls outside checkpointing keep
// one reduction for all of them.
struct Reuse {
  const char* name;
  int forwards;     // forwards summed into one backward
  int twice_block;  // block 1 called twice per forward (-1: once)
  bool checkpoint;
  bool nest_base;
  int micro_steps;
  int gatherings;   // times block 1 is gathered in each micro-step's backward
  bool unused_gates = false;  // each block's gate used on even steps only (none stays none)
  bool bf16 = false;
};
const Reuse kReuses[] = {
    {"TwoForwardsCheckpointed", 2, -1, true, false, 1, 2},
    {"TwoRegionsOneForward", 1, 1, true, false, 1, 2},
    {"NestedUnitsTwoForwardsCheckpointed", 2, -1, true, true, 1, 2},
    {"TwoForwardsCheckpointedAccumulated", 2, -1, true, false, 2, 2},
    {"TwiceOutsideCheckpointing", 1, 1, false, false, 1, 1},
    {"TwoRegionsGateUnusedOnOddSteps", 1, 1, true, false, 1, 2, true},
    {"TwoForwardsCheckpointedBf16", 2, -1, true, false, 1, 2, false, true},
};

using ReuseParam = std::tuple<size_t, ShardingStrategy, int>;  // case, strategy, prefetch depth
class UsedAgainInBackward : public ::testing::TestWithParam<ReuseParam> {};

// Block `unit`'s post-backwards and reductions in order, e.g. "PRAPRA".
std::string reduction_trace(const std::vector<FSDPEvent>& events, const std::string& unit) {
  std::string out;
  for (const auto& e : events) {
    if (e.unit != unit) continue;
    if (e.kind == FSDPEvent::Kind::kPostBackward) out += 'P';
    if (e.kind == FSDPEvent::Kind::kReduceScatter) out += 'R';
    if (e.kind == FSDPEvent::Kind::kAllReduce) out += 'A';
  }
  return out;
}

TEST_P(UsedAgainInBackward, MatchesOneProcessWithOneReductionPerGathering) {
  const auto& [index, strategy, prefetch] = GetParam();
  const Reuse& r = kReuses[index];
  const int w = test_world().size();
  Scenario s;
  s.strategy = strategy;
  if (s.strategy == ShardingStrategy::kHybridShard && hybrid_fsdp_size(w) == 0) GTEST_SKIP();
  s.forwards_per_step = r.forwards;
  s.net.twice_block = r.twice_block;
  s.net.checkpoint = r.checkpoint;
  s.nest_base = r.nest_base;
  s.micro_steps = r.micro_steps;
  s.prefetch_depth = prefetch;
  s.net.gate = r.unused_gates;
  s.gate_on_even_steps = r.unused_gates;
  s.bf16 = r.bf16;
  RunLog log, reference_log;
  expect_matches_reference(s, &log, &reference_log);
  if (r.unused_gates) {
    EXPECT_EQ(log.gate_grad_defined, reference_log.gate_grad_defined);
    EXPECT_EQ(log.gate_grad_defined, (std::vector<bool>{true, false, true, false, true}));
  }

  // The expected trace from the mesh alone: each gathering's post-backward,
  // then (synchronised micro-steps only) its reduce-scatter when the shard
  // group has several ranks and its all-reduce when there are replicas.
  int shard = w;
  if (strategy == ShardingStrategy::kNoShard) shard = 1;
  if (strategy == ShardingStrategy::kHybridShard) shard = hybrid_fsdp_size(w);
  const int replicas = w / shard;
  std::string want;
  for (int m = 0; m < r.micro_steps; ++m) {
    const bool sync = m == r.micro_steps - 1;
    for (int g = 0; g < r.gatherings; ++g) {
      want += 'P';
      if (sync && shard > 1) want += 'R';
      if (sync && replicas > 1) want += 'A';
    }
  }
  EXPECT_EQ(reduction_trace(log.last_step_events, "b1"), want);
  if (r.nest_base) {
    EXPECT_EQ(reduction_trace(log.last_step_events, "b1.base"), want);
  }
}
INSTANTIATE_TEST_SUITE_P(
    Patterns, UsedAgainInBackward,
    ::testing::Combine(::testing::Range<size_t>(0, std::size(kReuses)),
                       ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                         ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard),
                       ::testing::Values(0, 1)),
    [](const ::testing::TestParamInfo<ReuseParam>& info) {
      return std::string(kReuses[std::get<0>(info.param)].name) + "_" + to_string(std::get<1>(info.param)) +
             "_prefetch" + std::to_string(std::get<2>(info.param));
    });

// Inside one checkpointed region a unit is called on a constant (no input
// needing a gradient, so no post-backward node) and then on the region's
// input: its backward ends only at the end of backward, not when the
// second call's node runs, since the first call's gradients come after it.
struct ConstantThenInputImpl : torch::nn::Module {
  explicit ConstantThenInputImpl(int64_t dim)
      : in_proj(register_module("in_proj", torch::nn::Linear(dim, dim))),
        inner(register_module("inner", torch::nn::Linear(dim, dim))),
        constant(torch::linspace(-1, 1, dim).unsqueeze(0)) {}
  torch::Tensor forward(const torch::Tensor& x, bool checkpointed) {
    const auto region = [this](const torch::Tensor& h) {
      const torch::Tensor bias = torch::tanh(fsdp::call(inner, constant));
      return torch::tanh(fsdp::call(inner, h + bias));
    };
    const torch::Tensor h = fsdp::call(in_proj, x);
    return (checkpointed ? fsdp::nn::checkpoint(region, h) : region(h)).sum(1);
  }
  torch::nn::Linear in_proj, inner;
  torch::Tensor constant;
};
TORCH_MODULE(ConstantThenInput);

class RecomputedOnAConstant : public ::testing::TestWithParam<ShardingStrategy> {};
TEST_P(RecomputedOnAConstant, FirstCallWithoutANodeKeepsTheUnitGatheredToTheEnd) {
  const ShardingStrategy strategy = GetParam();
  const int w = test_world().size();
  const int rank = test_world().rank();
  if (strategy == ShardingStrategy::kHybridShard && hybrid_fsdp_size(w) == 0) GTEST_SKIP();
  constexpr int64_t kDim = 11;
  torch::manual_seed(kInitSeed);
  ConstantThenInput net(kDim);
  torch::manual_seed(kInitSeed);
  ConstantThenInput reference(kDim);
  FullyShardOptions options;
  options.mesh = mesh_for(strategy);
  options.strategy = strategy;
  fully_shard(net->inner, options);
  fully_shard(net, options);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  torch::optim::SGD reference_optimizer(reference->parameters(), 0.1);
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor x = inputs_of(step, 0, kRowsPerRank * w, kDim);
    optimizer.zero_grad();
    fsdp::call(net, x.narrow(0, rank * kRowsPerRank, kRowsPerRank), true).square().mean().backward();
    optimizer.step();
    reference_optimizer.zero_grad();
    reference->forward(x, false).square().mean().backward();
    reference_optimizer.step();
    EXPECT_EQ(memory::gathered_bytes(), 0) << "gathered buffers left after step " << step;
  }
  std::string worst;
  EXPECT_LE(max_relative_difference(full_parameters(*net), named(*reference), &worst), kTolerance) << worst;
}
INSTANTIATE_TEST_SUITE_P(Strategies, RecomputedOnAConstant,
                         ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// fsdp::replicate (DDP) against one process on the same global batch, with
// gradients averaged in buckets of a few parameters: plain steps, two
// forwards before one backward, accumulation without synchronisation,
// parameters unused in some steps (none stays none), checkpointed blocks
// (backwards inside the backward), and a block applied twice.
struct ReplicatedCase {
  const char* name;
  int forwards;
  int micro_steps;
  bool unused_gates;
  bool checkpoint;
  int twice_block;
};
const ReplicatedCase kReplicatedCases[] = {
    {"PlainSteps", 1, 1, false, false, -1},
    {"TwoForwardsOneBackward", 2, 1, false, false, -1},
    {"AccumulatedWithoutSync", 1, 2, false, false, -1},
    {"GateUnusedOnOddSteps", 1, 1, true, false, -1},
    {"CheckpointedBlocksTwoForwards", 2, 1, false, true, -1},
    {"BlockAppliedTwice", 1, 1, false, false, 1},
};
class Replicated : public ::testing::TestWithParam<size_t> {};
TEST_P(Replicated, MatchesOneProcessWithBucketsReducedDuringBackward) {
  const ReplicatedCase& c = kReplicatedCases[GetParam()];
  Scenario s;
  s.replicated = true;
  s.forwards_per_step = c.forwards;
  s.micro_steps = c.micro_steps;
  s.net.gate = c.unused_gates;
  s.gate_on_even_steps = c.unused_gates;
  s.net.checkpoint = c.checkpoint;
  s.net.twice_block = c.twice_block;
  RunLog log, reference_log;
  expect_matches_reference(s, &log, &reference_log);
  if (c.unused_gates) {
    EXPECT_EQ(log.gate_grad_defined, reference_log.gate_grad_defined);
    EXPECT_EQ(log.gate_grad_defined, (std::vector<bool>{true, false, true, false, true}));
  }
  ASSERT_EQ(log.replicate_stats.size(), 5u);
  const ReplicateStats& last = log.replicate_stats.back();
  EXPECT_GE(last.buckets, 4) << "the 2 KB cap should make several buckets";
  EXPECT_EQ(last.synchronised_backwards, 5) << "one synchronised backward per step";
  // Every bucket whose parameters all got gradients was averaged while
  // backward still ran, not at its end (the gates' bucket waits on odd steps).
  EXPECT_EQ(last.reduced_during_backward, last.buckets);
  // Blocks recomputed once per forward get a second gradient after their
  // bucket started: those buckets are averaged again, the others not.
  if (c.checkpoint && c.forwards > 1) {
    EXPECT_GT(last.reduced_again, 0);
  } else {
    EXPECT_EQ(last.reduced_again, 0);
  }
}
INSTANTIATE_TEST_SUITE_P(Cases, Replicated, ::testing::Range<size_t>(0, std::size(kReplicatedCases)),
                         [](const auto& info) { return std::string(kReplicatedCases[info.param].name); });

// What runs between backward and step.
enum class BeforeStep { kNothing, kEvaluation, kDroppedForward };
class ReplicatedBf16 : public ::testing::TestWithParam<BeforeStep> {};
TEST_P(ReplicatedBf16, ComputesInBf16AndAveragesInFp32AsEachRanksRowsReplayed) {
  // DDP's mixed_precision: each rank's rows through a bf16 copy of the
  // weights, the bf16 gradients averaged in fp32 and stepped on the fp32
  // masters. An evaluation, or a forward with gradients whose graph is
  // dropped, between backward and step must leave the parameters on their
  // masters for the optimizer.
  Scenario s;
  s.replicated = true;
  s.bf16 = true;
  s.eval_before_step = GetParam() == BeforeStep::kEvaluation;
  s.dropped_forward_before_step = GetParam() == BeforeStep::kDroppedForward;
  // Both sides run the same bf16 kernels on the same rows and average the
  // same widened gradients: measured bit-identical at W = 1 to 4. The
  // bound leaves room for an fp32 summation order over the ranks that a
  // backend might change.
  s.tolerance = 1e-6;
  expect_matches_reference(s);
  // The weights the optimizer holds are fp32 again after each step.
  auto net = build(s);
  ReplicateOptions options{test_world_ptr()};
  options.mixed_precision.param_dtype = torch::kBFloat16;
  options.mixed_precision.reduce_dtype = torch::kFloat;
  replicate(net, options);
  torch::Tensor x = inputs_of(0, 0, kRowsPerRank, s.net.dim);
  torch::Tensor out = fsdp::call(net, x);
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16) << "the forward computed in bf16";
  EXPECT_EQ(net->head->weight.scalar_type(), torch::kFloat) << "between forward and backward: the masters";
  torch::mse_loss(out.to(torch::kFloat), targets_of(0, 0, kRowsPerRank)).backward();
  for (const auto& p : net->parameters()) {
    EXPECT_EQ(p.scalar_type(), torch::kFloat);
    if (p.requires_grad()) {
      EXPECT_EQ(p.grad().scalar_type(), torch::kFloat);
    }
  }
}
INSTANTIATE_TEST_SUITE_P(Replicate, ReplicatedBf16,
                         ::testing::Values(BeforeStep::kNothing, BeforeStep::kEvaluation, BeforeStep::kDroppedForward),
                         [](const auto& info) {
                           switch (info.param) {
                             case BeforeStep::kNothing: return std::string("plain");
                             case BeforeStep::kEvaluation: return std::string("evaluation_before_step");
                             case BeforeStep::kDroppedForward: return std::string("dropped_forward_before_step");
                           }
                           return std::string("?");
                         });

TEST(Replicate, MixedPrecisionRefusesAnOutputDtype) {
  auto net = build(Scenario{});
  ReplicateOptions options{test_world_ptr()};
  options.mixed_precision.param_dtype = torch::kBFloat16;
  options.mixed_precision.output_dtype = torch::kFloat;
  try {
    replicate(net, options);
    ADD_FAILURE() << "output_dtype was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("output_dtype is fully_shard's"), std::string::npos) << e.what();
  }
}

TEST(Replicate, ARankDependentGraphMatchesEachRanksRowsReplayed) {
  // The gates are used on rank 0 only: the ranks reach their buckets in
  // different states yet issue the same all-reduces in the same order, and
  // a gradient only rank 0 has is averaged with the other ranks' zeros.
  // Gradients are zeroed in place between steps, so each backward adds
  // into the bucket memory the last one handed over.
  const int w = test_world().size();
  const int rank = test_world().rank();
  AdapterNetConfig config;
  config.gate = true;
  auto net = make_adapter_net(config, kInitSeed);
  auto reference = make_adapter_net(config, kInitSeed);
  replicate(net, ReplicateOptions{test_world_ptr(), /*bucket_cap_mb=*/0.002});
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  torch::optim::SGD reference_optimizer(reference->parameters(), 0.1);
  const auto zero_in_place = [](torch::nn::Module& m) {
    for (auto& p : m.parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  };
  const int64_t rows = kRowsPerRank * w;
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor x = inputs_of(step, 0, rows, config.dim);
    const torch::Tensor y = targets_of(step, 0, rows);
    for (auto& b : net->blocks) b->use_gate = rank == 0;
    zero_in_place(*net);
    torch::mse_loss(fsdp::call(net, x.narrow(0, rank * kRowsPerRank, kRowsPerRank)),
                    y.narrow(0, rank * kRowsPerRank, kRowsPerRank))
        .backward();
    optimizer.step();
    zero_in_place(*reference);
    for (int r = 0; r < w; ++r) {
      for (auto& b : reference->blocks) b->use_gate = r == 0;
      torch::mse_loss(reference->forward(x.narrow(0, r * kRowsPerRank, kRowsPerRank)),
                      y.narrow(0, r * kRowsPerRank, kRowsPerRank))
          .backward();
    }
    {
      torch::NoGradGuard no_grad;
      for (auto& p : reference->parameters()) p.mutable_grad().div_(w);
    }
    reference_optimizer.step();
  }
  std::string worst;
  EXPECT_LE(max_relative_difference(named(*net), named(*reference), &worst), kTolerance) << worst;
  EXPECT_TRUE(net->blocks[0]->gate.grad().defined()) << "rank 0's gate gradient reached every rank";
  const ReplicateStats stats = replicate_stats(*net);
  EXPECT_GE(stats.buckets, 4);
  if (rank == 0) {
    EXPECT_EQ(stats.reduced_during_backward, stats.buckets);
  } else {
    EXPECT_LT(stats.reduced_during_backward, stats.buckets) << "the gates' buckets waited for the end";
  }
}

TEST(Replicate, AParameterUnfrozenAfterReplicateIsRefused) {
  auto net = make_adapter_net(AdapterNetConfig{}, kInitSeed);
  for (auto& p : net->blocks[1]->parameters()) p.set_requires_grad(false);
  replicate(net, ReplicateOptions{test_world_ptr()});
  for (auto& p : net->blocks[1]->parameters()) p.set_requires_grad(true);
  try {
    fsdp::call(net, torch::randn({2, 23}));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("b1."), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("before replicate()"), std::string::npos) << e.what();
  }
}

TEST(Replicate, TakesRankZerosWeightsAndBuffers) {
  const int rank = test_world().rank();
  AdapterNetConfig config;
  auto net = make_adapter_net(config, kInitSeed + static_cast<uint64_t>(rank));  // each rank its own init
  replicate(net, ReplicateOptions{test_world_ptr()});
  const auto expected = named(*make_adapter_net(config, kInitSeed));  // rank 0's
  std::string worst;
  EXPECT_EQ(max_relative_difference(named(*net), expected, &worst), 0.0) << worst;
}

TEST(Replicate, ACallAroundItsHooksIsRefusedNamingTheFix) {
  auto net = make_adapter_net(AdapterNetConfig{}, kInitSeed);
  replicate(net, ReplicateOptions{test_world_ptr()});
  try {
    net->forward(torch::randn({2, 23})).sum().backward();  // skips fsdp::call
    ADD_FAILURE() << "expected an error";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("fsdp::call(model, x)"), std::string::npos) << what;
    EXPECT_NE(what.find("FSDP_MODULE"), std::string::npos) << what;
  }
  dist::barrier(test_world().group());
}

TEST(Replicate, RefusesAModuleWithShardedUnitsAndASecondReplicate) {
  auto net = make_adapter_net(AdapterNetConfig{}, kInitSeed);
  FullyShardOptions options;
  options.mesh = mesh_for(ShardingStrategy::kFullShard);
  fully_shard(net->blocks[0], options);
  try {
    replicate(net, ReplicateOptions{test_world_ptr()});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("b0"), std::string::npos) << e.what();
  }
  auto plain = make_adapter_net(AdapterNetConfig{}, kInitSeed);
  replicate(plain, ReplicateOptions{test_world_ptr()});
  EXPECT_THROW(replicate(plain, ReplicateOptions{test_world_ptr()}), Error);
  // The other way round: a replicated module carries its call hooks where
  // a unit's would go, and fully_shard says which one it is.
  try {
    fully_shard(plain, options);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is replicated by replicate"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(is_replicated(*plain));
  EXPECT_FALSE(is_fully_sharded(*plain));
}

}  // namespace
}  // namespace fsdp::testing::fsdp_off_path_test
