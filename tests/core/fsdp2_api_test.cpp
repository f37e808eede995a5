// FSDP2's run-time API beside fully_shard, each against plain one-process
// training of the same global batch (or its hand-derived multiple): the
// reshard settings, explicit unshard/reshard, the reduction knobs (divide
// factor, all-reduce hook, HSDP accumulation without all-reduce), clipping
// by the largest magnitude, bf16 modules sharded without an fp32 copy, and
// several modules sharded as one unit.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <type_traits>

#include "../distributed/dist_test_world.h"
#include "adapter_net.h"
#include "fsdp/common/error.h"
#include "core/fsdp_state.h"
#include "fsdp/core/grad_norm.h"
#include "fsdp/core/memory.h"
#include "fsdp_test_support.h"

namespace fsdp::testing::fsdp2_api_test {
namespace {

constexpr int64_t kRowsPerRank = 3;
constexpr double kTolerance = 1e-5;

AdapterNetConfig net_config() {
  AdapterNetConfig c;
  c.dim = 23;
  c.blocks = 3;
  return c;
}

torch::Tensor inputs_of(int step, int micro, int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 * step + micro + 3);
  return torch::randn({rows, net_config().dim}, gen);
}
torch::Tensor targets_of(int step, int micro, int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(700 * step + micro + 11);
  return torch::randn({rows, 2}, gen);
}
int64_t global_rows() { return kRowsPerRank * test_world().size(); }
torch::Tensor local_rows(const torch::Tensor& t) {
  return t.narrow(0, test_world().rank() * kRowsPerRank, kRowsPerRank);
}

bool strategy_runs(ShardingStrategy s) {
  const int w = test_world().size();
  if (s == ShardingStrategy::kHybridShard) return hybrid_fsdp_size(w) != 0;
  return true;
}

AdapterNet sharded_net(ShardingStrategy strategy, const std::function<void(FullyShardOptions&)>& edit = {},
                       const AdapterNetConfig& config = net_config()) {
  auto net = make_adapter_net(config, kInitSeed);
  FullyShardOptions options;
  options.mesh = mesh_for(strategy);
  options.strategy = strategy;
  if (edit) edit(options);
  for (auto& b : net->blocks) fully_shard(b, options);
  fully_shard(net, options);
  return net;
}

NamedTensors named(torch::nn::Module& m) {
  NamedTensors out;
  for (const auto& [name, p] : full_parameters(m)) out.emplace_back(name, p);
  return out;
}

// Plain training: `micro` micro-steps per step over the global batch, loss
// averaged over them, AdamW(1e-2, weight decay 0.1) on every parameter, in
// the module's `dtype` (inputs cast to it, the loss in fp32).
NamedTensors train_plain(int steps, int micro, torch::ScalarType dtype = torch::kFloat,
                         const AdapterNetConfig& config = net_config(),
                         const std::function<void(AdapterNet&, int, int)>& before_micro = {}) {
  auto net = make_adapter_net(config, kInitSeed);
  net->to(dtype);
  torch::optim::AdamW optimizer(unique_parameters(*net), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int step = 0; step < steps; ++step) {
    for (int m = 0; m < micro; ++m) {
      if (before_micro) before_micro(net, step, m);
      torch::Tensor out = net->forward(inputs_of(step, m, global_rows()).to(dtype)).to(torch::kFloat);
      (torch::mse_loss(out, targets_of(step, m, global_rows())) / micro).backward();
    }
    optimizer.step();
    optimizer.zero_grad();
  }
  NamedTensors out;
  for (const auto& item : net->named_parameters()) out.emplace_back(item.key(), item.value().detach().to(torch::kFloat));
  return out;
}

// The same loop sharded; `before_micro(net, step, m)` sets what a test
// changes per micro-step, and `after_forward` looks at the state between
// forward and backward.
struct ShardedLoop {
  int steps = 3;
  int micro = 1;
  std::function<void(AdapterNet&, int, int)> before_micro;
  std::function<void(AdapterNet&, int, int)> after_forward;
  std::function<void(AdapterNet&, int)> before_step;
};

NamedTensors train_sharded(AdapterNet& net, const ShardedLoop& loop) {
  torch::optim::AdamW optimizer(unique_parameters(*net), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int step = 0; step < loop.steps; ++step) {
    for (int m = 0; m < loop.micro; ++m) {
      if (loop.before_micro) loop.before_micro(net, step, m);
      torch::Tensor out = fsdp::call(net, local_rows(inputs_of(step, m, global_rows())));
      if (loop.after_forward) loop.after_forward(net, step, m);
      (torch::mse_loss(out, local_rows(targets_of(step, m, global_rows()))) / loop.micro).backward();
    }
    if (loop.before_step) loop.before_step(net, step);
    optimizer.step();
    optimizer.zero_grad();
  }
  return named(*net);
}

void expect_equal_training(const NamedTensors& sharded, const NamedTensors& plain, double tolerance = kTolerance,
                           const AdapterNetConfig& config = net_config()) {
  std::string worst;
  EXPECT_LE(max_relative_difference(sharded, plain, &worst), tolerance) << "worst parameter: " << worst;
  auto initial = make_adapter_net(config, kInitSeed);
  NamedTensors start;
  for (const auto& item : initial->named_parameters()) start.emplace_back(item.key(), item.value().detach().clone());
  EXPECT_GT(max_relative_difference(plain, start, nullptr), 1e-3) << "training changed nothing";
}

int count(const std::vector<FSDPEvent>& events, FSDPEvent::Kind kind, const std::string& unit = "") {
  int n = 0;
  for (const auto& e : events) n += e.kind == kind && (unit.empty() || e.unit == unit) ? 1 : 0;
  return n;
}

std::string strategy_name(const ::testing::TestParamInfo<ShardingStrategy>& info) { return to_string(info.param); }

// --- reshard_after_forward --------------------------------------------------

class ReshardAfterForward : public ::testing::TestWithParam<bool> {};
TEST_P(ReshardAfterForward, SetAtRunTimeDecidesWhatStaysGatheredForTheRootToo) {
  // Under full_shard, set at run time on the whole tree: true frees every
  // unit after forward, the root included (the root keeps its own by
  // default); false keeps every unit, so backward gathers nothing again.
  const bool reshard = GetParam();
  const int w = test_world().size();
  auto net = sharded_net(ShardingStrategy::kFullShard);
  set_reshard_after_forward(*net, reshard);
  ShardedLoop loop;
  std::vector<int64_t> gathered_after_forward;
  loop.before_micro = [](AdapterNet& n, int, int) { clear_event_log(*n); };
  loop.after_forward = [&](AdapterNet&, int, int) { gathered_after_forward.push_back(memory::gathered_bytes()); };
  int gathers_last_step = 0;
  loop.before_step = [&](AdapterNet& n, int) { gathers_last_step = count(event_log(*n), FSDPEvent::Kind::kAllGather); };
  expect_equal_training(train_sharded(net, loop), train_plain(loop.steps, 1));
  if (w == 1) return;  // one rank: a unit is its own shard, nothing is gathered
  for (int64_t bytes : gathered_after_forward) {
    if (reshard) {
      EXPECT_EQ(bytes, 0) << "a unit stayed gathered after forward";
    } else {
      EXPECT_GT(bytes, 0);
    }
  }
  // Four units (three blocks and the root): gathered once per forward and,
  // when freed, once more for backward.
  EXPECT_EQ(gathers_last_step, reshard ? 8 : 4);
}
INSTANTIATE_TEST_SUITE_P(Setting, ReshardAfterForward, ::testing::Values(true, false),
                         [](const auto& info) { return std::string(info.param ? "reshard" : "keep"); });

TEST(ReshardAfterForward, OptionSetForTheRootFreesItAfterForward) {
  if (test_world().size() == 1) GTEST_SKIP() << "one rank gathers nothing";
  auto net = sharded_net(ShardingStrategy::kShardGradOp, [](FullyShardOptions& o) { o.reshard_after_forward = true; });
  torch::Tensor out = fsdp::call(net, local_rows(inputs_of(0, 0, global_rows())));
  EXPECT_EQ(memory::gathered_bytes(), 0) << "shard_grad_op with reshard_after_forward=true must free every unit";
  torch::mse_loss(out, local_rows(targets_of(0, 0, global_rows()))).backward();
  EXPECT_EQ(memory::gathered_bytes(), 0);
}

// A unit computed in another dtype than its shard's (bf16 over fp32 shards)
// holds a cast copy even on one rank, where nothing is gathered: "free
// after forward" frees it there as on many ranks, and backward casts again.
TEST(ReshardAfterForward, FreesTheCastCopyOnOneRankToo) {
  auto net = sharded_net(ShardingStrategy::kFullShard, [](FullyShardOptions& o) {
    o.mixed_precision.param_dtype = torch::kBFloat16;
    o.mixed_precision.reduce_dtype = torch::kFloat;
  });
  set_reshard_after_forward(*net, true);
  torch::Tensor out = fsdp::call(net, local_rows(inputs_of(0, 0, global_rows())));
  EXPECT_EQ(memory::gathered_bytes(), 0) << "a unit kept its bf16 copy after forward";
  torch::mse_loss(out.to(torch::kFloat), local_rows(targets_of(0, 0, global_rows()))).backward();
  EXPECT_EQ(memory::gathered_bytes(), 0);
}

// --- reshard_after_forward = k: kept sharded over fewer ranks ---------------

// Every unit (the root too: set explicitly, it holds for the root) keeps
// 1/k of its gathered buffer after forward; backward's gathers run over k
// ranks, forward's over all W.
TEST(ReshardAfterForwardToFewerRanks, BackwardGathersInsideGroupsOfKAndTrainsAsOneProcess) {
  const int w = test_world().size();
  if (w != 4) GTEST_SKIP() << "needs a shard group with a divisor strictly between 1 and its size (W = 4)";
  for (const bool by_setter : {false, true}) {
    constexpr int k = 2;
    const auto set_k = [&](FullyShardOptions& o) { o.reshard_after_forward = k; };
    auto net = by_setter ? sharded_net(ShardingStrategy::kFullShard) : sharded_net(ShardingStrategy::kFullShard, set_k);
    if (by_setter) set_reshard_after_forward(*net, k);
    std::vector<torch::nn::Module*> units{net.get()};
    for (auto& b : net->blocks) units.push_back(b.get());
    int64_t kept_bytes = 0;
    for (auto* u : units) kept_bytes += detail::state_of(*u)->group()->flat_numel() * 4 / k;
    ShardedLoop loop;
    std::vector<int64_t> held_after_forward;
    std::vector<FSDPEvent> last_step;
    loop.before_micro = [](AdapterNet& n, int, int) { clear_event_log(*n); };
    loop.after_forward = [&](AdapterNet&, int, int) { held_after_forward.push_back(memory::gathered_bytes()); };
    loop.before_step = [&](AdapterNet& n, int) { last_step = event_log(*n); };
    expect_equal_training(train_sharded(net, loop), train_plain(loop.steps, 1));
    for (int64_t bytes : held_after_forward) EXPECT_EQ(bytes, kept_bytes) << "held between forward and backward";
    EXPECT_EQ(memory::gathered_bytes(), 0) << "a kept part outlived its backward";
    for (const std::string unit : {"<root>", "b0", "b1", "b2"}) {
      std::vector<int> gathers, reductions;
      for (const auto& e : last_step) {
        if (e.unit != unit) continue;
        if (e.kind == FSDPEvent::Kind::kAllGather) gathers.push_back(e.ranks);
        if (e.kind == FSDPEvent::Kind::kReduceScatter) reductions.push_back(e.ranks);
      }
      EXPECT_EQ(gathers, (std::vector<int>{w, k})) << unit << ": forward over the shard group, backward inside a group";
      EXPECT_EQ(reductions, (std::vector<int>{w})) << unit;
    }
  }
}

TEST(ReshardAfterForwardToFewerRanks, ANumberThatDoesNotDivideTheShardGroupIsRefused) {
  const int w = test_world().size();
  const int k = w == 3 ? 2 : 3;
  expect_error_on_every_rank(
      [&] { sharded_net(ShardingStrategy::kFullShard, [&](FullyShardOptions& o) { o.reshard_after_forward = k; }); },
      {"reshard_after_forward=" + std::to_string(k), "must divide", std::to_string(w)});
  auto net = sharded_net(ShardingStrategy::kFullShard);
  expect_error_on_every_rank([&] { set_reshard_after_forward(*net, k); }, {"must divide"});
  // Nothing was changed: it still trains as one process.
  ShardedLoop loop;
  expect_equal_training(train_sharded(net, loop), train_plain(loop.steps, 1));
}

// --- reshard_after_backward -------------------------------------------------

TEST(ReshardAfterBackward, FalseSkipsTheNextMicroStepsGatherAndStillMatches) {
  // Two micro-steps, synchronised on the second. With
  // set_reshard_after_backward(false) the first backward leaves every unit
  // gathered, so the second forward issues no all-gather; the synchronising
  // backward reshards, so step() sees sharded parameters.
  const int w = test_world().size();
  auto net = sharded_net(ShardingStrategy::kFullShard);
  set_reshard_after_backward(*net, false);
  ShardedLoop loop;
  loop.micro = 2;
  std::vector<int> gathers_in_second_forward;
  loop.before_micro = [](AdapterNet& n, int, int m) {
    set_requires_gradient_sync(*n, m == 1);
    clear_event_log(*n);
  };
  loop.after_forward = [&](AdapterNet& n, int, int m) {
    if (m == 1) gathers_in_second_forward.push_back(count(event_log(*n), FSDPEvent::Kind::kAllGather));
  };
  loop.before_step = [](AdapterNet&, int) { EXPECT_EQ(memory::gathered_bytes(), 0) << "gathered at step()"; };
  expect_equal_training(train_sharded(net, loop), train_plain(loop.steps, 2));
  if (w == 1) return;
  ASSERT_EQ(gathers_in_second_forward.size(), 3u);
  for (int n : gathers_in_second_forward) EXPECT_EQ(n, 0) << "the second micro-step gathered again";

  // The default reshards: the second forward gathers every unit again.
  auto plain_setting = sharded_net(ShardingStrategy::kFullShard);
  gathers_in_second_forward.clear();
  train_sharded(plain_setting, loop);
  for (int n : gathers_in_second_forward) EXPECT_EQ(n, 4);
}

// --- explicit unshard / reshard ---------------------------------------------

TEST(ExplicitUnshard, AsyncUnshardIsIssuedBeforeTheForwardAndUsedByIt) {
  const int w = test_world().size();
  auto net = sharded_net(ShardingStrategy::kFullShard, [](FullyShardOptions& o) { o.prefetch_depth = 0; });
  ShardedLoop loop;
  std::vector<std::vector<FSDPEvent>> logs;
  UnshardHandle handle;
  std::vector<int64_t> gathered_before_forward;
  loop.before_micro = [&](AdapterNet& n, int, int) {
    clear_event_log(*n);
    handle = unshard(*n->blocks[2], /*async_op=*/true);  // the last block, gathered ahead by hand
    gathered_before_forward.push_back(memory::gathered_bytes());
  };
  loop.after_forward = [&](AdapterNet& n, int, int) { logs.push_back(event_log(*n)); };
  int gathers_in_wait = -1;
  loop.before_step = [&](AdapterNet& n, int) {
    // The forward used the gather: waiting now does nothing (no gather
    // again, nothing left gathered for step()).
    const int before = count(event_log(*n), FSDPEvent::Kind::kAllGather);
    handle.wait();
    gathers_in_wait = count(event_log(*n), FSDPEvent::Kind::kAllGather) - before;
    EXPECT_EQ(memory::gathered_bytes(), 0) << "wait() after the forward gathered again";
  };
  expect_equal_training(train_sharded(net, loop), train_plain(loop.steps, 1));
  EXPECT_EQ(gathers_in_wait, 0);
  if (w == 1) return;
  for (int64_t bytes : gathered_before_forward) EXPECT_GT(bytes, 0) << "the async unshard allocated nothing";
  for (const auto& events : logs) {
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.front().kind, FSDPEvent::Kind::kAllGather);
    EXPECT_EQ(events.front().unit, "b2") << "the hand-issued gather comes first";
    EXPECT_EQ(count(events, FSDPEvent::Kind::kAllGather, "b2"), 1) << "b2's forward gathered again";
  }
}

TEST(ExplicitUnshard, UnshardShowsFullParametersAndReshardPutsThemBack) {
  auto net = sharded_net(ShardingStrategy::kFullShard);
  const auto full = full_parameters(*net);
  const torch::Tensor* expected = nullptr;
  for (const auto& [name, t] : full) {
    if (name == "b1.base.weight") expected = &t;
  }
  ASSERT_NE(expected, nullptr);
  unshard(*net->blocks[1]);
  const torch::Tensor& w = net->blocks[1]->base->weight;
  ASSERT_EQ(w.sizes(), expected->sizes());
  EXPECT_TRUE(torch::equal(w.detach(), *expected));
  reshard(*net->blocks[1]);
  EXPECT_EQ(w.dim(), 1) << "resharded: the parameter is its 1-D shard again";
  EXPECT_EQ(memory::gathered_bytes(), 0);
  // Training afterwards is unaffected.
  ShardedLoop loop;
  expect_equal_training(train_sharded(net, loop), train_plain(loop.steps, 1));
}

// --- reduction knobs --------------------------------------------------------

// Each rank's shard of the gradients after one backward of the per-rank
// mean loss, and the plain global-mean gradients they are compared with.
struct OneBackward {
  std::vector<LocalShard> shards;
  std::map<std::string, torch::Tensor> plain;  // flattened
};
OneBackward one_backward(AdapterNet& net) {
  OneBackward out;
  torch::mse_loss(fsdp::call(net, local_rows(inputs_of(0, 0, global_rows()))),
                  local_rows(targets_of(0, 0, global_rows())))
      .backward();
  out.shards = local_shards(*net);
  auto ref = make_adapter_net(net_config(), kInitSeed);
  torch::mse_loss(ref->forward(inputs_of(0, 0, global_rows())), targets_of(0, 0, global_rows())).backward();
  for (const auto& item : ref->named_parameters()) out.plain[item.key()] = item.value().grad().reshape({-1});
  return out;
}
void expect_grads_are(const OneBackward& b, double multiple) {
  for (const auto& s : b.shards) {
    ASSERT_TRUE(s.param.grad().defined()) << s.fqn;
    const torch::Tensor want = b.plain.at(s.fqn).narrow(0, s.begin, s.numel) * multiple;
    // Rounding of the plain gradient is scaled by the multiple too.
    EXPECT_TRUE(torch::allclose(s.param.grad(), want, 1e-5, 1e-6 * std::max(1.0, std::abs(multiple))))
        << s.fqn << ": max diff " << (s.param.grad() - want).abs().max().item<double>();
  }
}

class ReductionKnobs : public ::testing::TestWithParam<ShardingStrategy> {};
TEST_P(ReductionKnobs, DivideFactorSumsTheRanksGradientsOverIt) {
  // Per-rank mean losses summed over W ranks and divided by f: the plain
  // global-mean gradient times W / f.
  if (!strategy_runs(GetParam())) GTEST_SKIP();
  const int w = test_world().size();
  for (double factor : {1.0, 2.0 * w}) {
    auto net = sharded_net(GetParam());
    set_gradient_divide_factor(*net, factor);
    expect_grads_are(one_backward(net), w / factor);
  }
  auto net = sharded_net(GetParam());
  set_gradient_divide_factor(*net, 1.0);
  set_gradient_divide_factor(*net, 0.0);  // back to averaging
  expect_grads_are(one_backward(net), 1.0);
}
TEST_P(ReductionKnobs, FactorAndHookActOnEachBackwardOnce) {
  // Two synchronised backwards of the same batch, gradients kept between
  // them: factor 1 and a hook tripling the reduced shard give 2 x 3 x W
  // times the plain mean gradient (not the factor or hook applied again to
  // what the first backward left, as on an in-place buffer).
  if (!strategy_runs(GetParam())) GTEST_SKIP();
  const int w = test_world().size();
  auto net = sharded_net(GetParam());
  set_gradient_divide_factor(*net, 1.0);
  set_all_reduce_hook(*net, [](at::Tensor& reduced) { reduced.mul_(3); });
  torch::mse_loss(fsdp::call(net, local_rows(inputs_of(0, 0, global_rows()))), local_rows(targets_of(0, 0, global_rows())))
      .backward();
  expect_grads_are(one_backward(net), 2.0 * 3.0 * w);
}
TEST_P(ReductionKnobs, AllReduceHookSeesEachReducedShardAndItsChangesAreKept) {
  if (!strategy_runs(GetParam())) GTEST_SKIP();
  auto net = sharded_net(GetParam());
  int calls = 0;
  int64_t numel_seen = 0;
  set_all_reduce_hook(*net, [&](at::Tensor& reduced) {
    ++calls;
    numel_seen += reduced.numel();
    reduced.mul_(3);
  });
  expect_grads_are(one_backward(net), 3.0);
  EXPECT_EQ(calls, 4) << "one call per unit";
  const int shard = mesh_for(GetParam())->layout().shard;
  int64_t expected = 0;
  for (auto* m : std::vector<torch::nn::Module*>{net.get(), net->blocks[0].get(), net->blocks[1].get(), net->blocks[2].get()}) {
    expected += detail::state_of(*m)->group()->flat_numel() / shard;
  }
  EXPECT_EQ(numel_seen, expected) << "the hook sees this rank's reduced shards";
}
TEST_P(ReductionKnobs, RequiresAllReduceFalseHoldsTheReductionUntilTheNextSync) {
  // HSDP-style accumulation: micro-step 1 reduces within the shard group
  // only (no all-reduce across replicas), micro-step 2 all-reduces the sum.
  // The gates are used in micro-step 1 only: their held gradient must
  // survive micro-step 2, where no rank uses them.
  if (!strategy_runs(GetParam())) GTEST_SKIP();
  const auto layout = mesh_for(GetParam())->layout();
  AdapterNetConfig config = net_config();
  config.gate = true;
  const auto gate_in_first_micro_step = [](AdapterNet& n, int, int m) {
    for (auto& b : n->blocks) b->use_gate = m == 0;
  };
  auto net = sharded_net(GetParam(), {}, config);
  ShardedLoop loop;
  loop.micro = 2;
  std::vector<int> all_reduces;  // per micro-step's backward
  loop.before_micro = [&](AdapterNet& n, int step, int m) {
    gate_in_first_micro_step(n, step, m);
    if (m == 1) all_reduces.push_back(count(event_log(*n), FSDPEvent::Kind::kAllReduce));
    set_requires_all_reduce(*n, m == 1);
    clear_event_log(*n);
  };
  loop.before_step = [&](AdapterNet& n, int) {
    all_reduces.push_back(count(event_log(*n), FSDPEvent::Kind::kAllReduce));
    EXPECT_TRUE(n->blocks[0]->gate.grad().defined()) << "micro-step 1's gate gradient was dropped";
  };
  expect_equal_training(train_sharded(net, loop), train_plain(loop.steps, 2, torch::kFloat, config, gate_in_first_micro_step),
                        kTolerance, config);
  ASSERT_EQ(all_reduces.size(), 6u);
  const int expected = layout.replicate > 1 ? 4 : 0;
  for (size_t i = 0; i < all_reduces.size(); ++i) EXPECT_EQ(all_reduces[i], i % 2 == 0 ? 0 : expected) << i;
}
INSTANTIATE_TEST_SUITE_P(Strategies, ReductionKnobs,
                         ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kNoShard,
                                           ShardingStrategy::kHybridShard),
                         strategy_name);

// --- clipping ---------------------------------------------------------------

TEST(ClipGradNorm, InfinityNormIsTheLargestMagnitudeOverAllShards) {
  const double inf = std::numeric_limits<double>::infinity();
  auto net = sharded_net(ShardingStrategy::kFullShard);
  torch::mse_loss(fsdp::call(net, local_rows(inputs_of(0, 0, global_rows()))), local_rows(targets_of(0, 0, global_rows())))
      .backward();
  auto ref = make_adapter_net(net_config(), kInitSeed);
  torch::mse_loss(ref->forward(inputs_of(0, 0, global_rows())), targets_of(0, 0, global_rows())).backward();
  const double want = torch::nn::utils::clip_grad_norm_(ref->parameters(), 1e-3, inf);
  const double got = clip_grad_norm_(*net, 1e-3, inf);
  EXPECT_NEAR(got, want, 1e-6 * want);
  std::map<std::string, torch::Tensor> clipped;
  for (const auto& item : ref->named_parameters()) clipped[item.key()] = item.value().grad().reshape({-1});
  for (const auto& s : local_shards(*net)) {
    const torch::Tensor expected = clipped.at(s.fqn).narrow(0, s.begin, s.numel);
    EXPECT_TRUE(torch::allclose(s.param.grad(), expected, 1e-5, 1e-8)) << s.fqn;
  }
  EXPECT_THROW(clip_grad_norm_(*net, 1.0, 3.0), Error);
  // A NaN in one rank's shard makes the norm NaN on every rank, as torch's.
  if (test_world().rank() == 0) {
    for (const auto& s : local_shards(*net)) {
      if (s.numel > 0) {
        s.param.grad()[0] = std::numeric_limits<float>::quiet_NaN();
        break;
      }
    }
  }
  EXPECT_TRUE(std::isnan(grad_norm(*net, inf)));
}

// --- bf16 modules -----------------------------------------------------------

// Step 0's gradients, checked directly: each rank's shard is the average
// over ranks of the bf16 gradients each rank's rows give, replayed here in
// one process on a bf16 copy (the same arithmetic per rank) and averaged in
// fp32. What stays is the one rounding of that average to bf16 (2^-8
// relative), far below what a sum instead of an average would give (W x).
void expect_bf16_gradients_are_the_ranks_average(AdapterNetImpl& sharded) {
  const int w = test_world().size();
  auto replay = make_adapter_net(net_config(), kInitSeed);
  replay->to(torch::kBFloat16);
  std::map<std::string, torch::Tensor> average;
  for (int r = 0; r < w; ++r) {
    for (auto& p : replay->parameters()) p.mutable_grad() = torch::Tensor();
    const auto rows = [&](const torch::Tensor& t) { return t.narrow(0, r * kRowsPerRank, kRowsPerRank); };
    torch::Tensor out = replay->forward(rows(inputs_of(0, 0, global_rows())).to(torch::kBFloat16));
    torch::mse_loss(out.to(torch::kFloat), rows(targets_of(0, 0, global_rows()))).backward();
    for (const auto& item : replay->named_parameters()) {
      const auto g = item.value().grad().to(torch::kFloat).reshape({-1}) / w;
      auto [it, fresh] = average.emplace(item.key(), g);
      if (!fresh) it->second += g;
    }
  }
  for (const auto& shard : local_shards(sharded)) {
    ASSERT_TRUE(shard.param.grad().defined()) << shard.fqn;
    const auto got = shard.param.grad().to(torch::kFloat);
    const auto want = average.at(shard.fqn).narrow(0, shard.begin, shard.numel);
    EXPECT_TRUE(torch::allclose(got, want, /*rtol=*/8e-3, /*atol=*/1e-6))
        << shard.fqn << ": largest difference " << (got - want).abs().max().item<double>() << " against "
        << want.abs().max().item<double>();
  }
}

TEST(Bf16Module, ShardsStayBf16WithNoFp32CopyAndTrain) {
  // A bf16 module is sharded as it is (FSDP2): half the bytes of the fp32
  // one, bf16 shards the optimizer updates, training as one bf16 process.
  auto fp32 = sharded_net(ShardingStrategy::kFullShard);
  auto net = make_adapter_net(net_config(), kInitSeed);
  net->to(torch::kBFloat16);
  FullyShardOptions options;
  options.mesh = mesh_for(ShardingStrategy::kFullShard);
  for (auto& b : net->blocks) fully_shard(b, options);
  fully_shard(net, options);
  EXPECT_EQ(sharded_param_bytes(*net) * 2, sharded_param_bytes(*fp32));
  for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
  torch::optim::AdamW optimizer(unique_parameters(*net), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int step = 0; step < 3; ++step) {
    torch::Tensor out = fsdp::call(net, local_rows(inputs_of(step, 0, global_rows())).to(torch::kBFloat16));
    torch::mse_loss(out.to(torch::kFloat), local_rows(targets_of(step, 0, global_rows()))).backward();
    if (step == 0) expect_bf16_gradients_are_the_ranks_average(*net);
    optimizer.step();
    optimizer.zero_grad();
  }
  for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
  NamedTensors widened;
  for (const auto& [name, t] : full_parameters(*net)) widened.emplace_back(name, t.to(torch::kFloat));
  // Against one process training the same bf16 module on the global batch:
  // at W = 1 the same arithmetic, so equal; above, the average of W bf16
  // gradients differs from the global batch's by bf16 rounding, which
  // AdamW's normalised step turns into parameter differences. Measured at
  // W = 2, 3, 4: 1.2e-2, 1.2e-1, 6.8e-3, the worst each time a LayerNorm
  // bias, which starts at zero (so its relative distance is the largest).
  const double bound = test_world().size() == 1 ? 0.0 : 0.25;
  expect_equal_training(widened, train_plain(3, 1, torch::kBFloat16), bound);
}

// --- several modules as one unit ------------------------------------------

class ModuleList : public ::testing::TestWithParam<ShardingStrategy> {};
TEST_P(ModuleList, TwoModulesShardedAsOneUnitTrainLikePlain) {
  // The input projection and the head, at either end of the blocks, as one
  // unit (then the root holds nothing of its own): one pre- and one
  // post-forward per forward for both modules, gathered from the first
  // call to the last, and training equal to one process.
  if (!strategy_runs(GetParam())) GTEST_SKIP();
  auto net = make_adapter_net(net_config(), kInitSeed);
  FullyShardOptions options;
  options.mesh = mesh_for(GetParam());
  options.strategy = GetParam();
  for (auto& b : net->blocks) fully_shard(b, options);
  fully_shard({net->in_proj.get(), net->head.get()}, options);
  fully_shard(net, options);
  ASSERT_EQ(detail::state_of(*net->in_proj), detail::state_of(*net->head));
  EXPECT_EQ(detail::state_of(*net)->group(), nullptr) << "the root holds no parameter of its own";
  EXPECT_EQ(detail::state_of(*net->head)->name(), "in_proj+head");
  ShardedLoop loop;
  std::vector<std::vector<FSDPEvent>> logs;
  loop.before_micro = [](AdapterNet& n, int, int) { clear_event_log(*n); };
  loop.before_step = [&](AdapterNet& n, int) { logs.push_back(event_log(*n)); };
  expect_equal_training(train_sharded(net, loop), train_plain(loop.steps, 1));
  const std::string unit = "in_proj+head";
  const bool gathers = mesh_for(GetParam())->layout().shard > 1;
  const int expected_gathers = GetParam() == ShardingStrategy::kShardGradOp ? 1 : 2;
  for (const auto& events : logs) {
    EXPECT_EQ(count(events, FSDPEvent::Kind::kPreForward, unit), 1);
    EXPECT_EQ(count(events, FSDPEvent::Kind::kPostForward, unit), 1);
    EXPECT_EQ(count(events, FSDPEvent::Kind::kAllGather, unit), gathers ? expected_gathers : 0);
  }
}
INSTANTIATE_TEST_SUITE_P(Strategies, ModuleList,
                         ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard),
                         strategy_name);

// Two sibling projections sharing one weight, after a plain projection that
// belongs to the root (so the pair's first call has inputs needing
// gradients): h = pre(x), then `a` applied `a_calls` times (tanh after
// each), then `b` unless skipped.
struct SharedProjImpl : torch::nn::Module {
  SharedProjImpl(torch::Tensor shared, int64_t dim)
      : w(register_parameter("w", shared)), bias(register_parameter("bias", torch::zeros({dim}))) {}
  torch::Tensor forward(torch::Tensor x) { return torch::matmul(x, w) + bias; }
  torch::Tensor w, bias;
};
TORCH_MODULE(SharedProj);
struct TiedPairImpl : torch::nn::Module {
  explicit TiedPairImpl(int64_t dim) {
    torch::manual_seed(kInitSeed);
    pre = register_module("pre", torch::nn::Linear(dim, dim));
    torch::Tensor w = torch::randn({dim, dim}) / std::sqrt(static_cast<double>(dim));
    a = register_module("a", SharedProj(w, dim));
    b = register_module("b", SharedProj(w, dim));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = pre(x);
    for (int i = 0; i < a_calls; ++i) h = torch::tanh(fsdp::call(a, h));
    return skip_b ? h : fsdp::call(b, h);
  }
  torch::nn::Linear pre{nullptr};
  SharedProj a{nullptr}, b{nullptr};
  int a_calls = 1;
  bool skip_b = false;
};
TORCH_MODULE(TiedPair);

TEST(ModuleList, SiblingsSharingAWeightCannotBeTwoUnits) {
  TiedPair apart(7);
  FullyShardOptions options;
  options.mesh = mesh_for(ShardingStrategy::kFullShard);
  fully_shard(apart->a, options);
  try {
    fully_shard(apart->b, options);
    ADD_FAILURE() << "a weight shared by two units was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fully_shard({a, b})"), std::string::npos) << e.what();
  }
}

// How the pair is called: once each; `a` twice before `b`; `b` skipped on
// odd steps (its round never completes in those forwards).
enum class PairCalls { kOnce, kFirstTwice, kSecondSkipped };

class TiedSiblings : public ::testing::TestWithParam<PairCalls> {};
TEST_P(TiedSiblings, OneUnitWithTheWeightOnceTrainsLikePlain) {
  constexpr int64_t kDim = 7;
  const PairCalls calls = GetParam();
  FullyShardOptions options;
  options.mesh = mesh_for(ShardingStrategy::kFullShard);
  TiedPair net(kDim), plain(kDim);
  fully_shard({net->a.get(), net->b.get()}, options);
  fully_shard(net, options);
  ASSERT_EQ(detail::state_of(*net->a)->group()->params().size(), 3u) << "w once, and the two biases";
  torch::optim::AdamW sharded_opt(unique_parameters(*net), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW plain_opt(unique_parameters(*plain), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 4; ++step) {
    for (TiedPair* m : {&net, &plain}) {
      (*m)->a_calls = calls == PairCalls::kFirstTwice ? 2 : 1;
      (*m)->skip_b = calls == PairCalls::kSecondSkipped && step % 2 == 1;
    }
    auto gen = at::make_generator<at::CPUGeneratorImpl>(step + 1);
    torch::Tensor x = torch::randn({global_rows(), kDim}, gen), y = torch::randn({global_rows(), kDim}, gen);
    torch::mse_loss(fsdp::call(net, local_rows(x)), local_rows(y)).backward();
    torch::mse_loss(plain->forward(x), y).backward();
    sharded_opt.step();
    plain_opt.step();
    // Zeroed in place after even steps (as LibTorch 1.13's zero_grad does),
    // set to none after odd ones: the next forward sets aside gradients
    // that exist, or none.
    for (TiedPair* m : {&net, &plain}) {
      for (auto& p : (*m)->parameters()) {
        if (!p.grad().defined()) continue;
        if (step % 2 == 0) {
          p.mutable_grad().zero_();
        } else {
          p.mutable_grad() = torch::Tensor();
        }
      }
    }
    EXPECT_EQ(memory::gathered_bytes(), 0) << "gathered after step " << step;
    {
      // An evaluation forward (the same calls) leaves nothing gathered.
      torch::NoGradGuard no_grad;
      fsdp::call(net, local_rows(x));
      EXPECT_EQ(memory::gathered_bytes(), 0) << "gathered after a no-grad forward, step " << step;
    }
  }
  NamedTensors expected;
  std::set<const void*> seen;
  for (const auto& item : plain->named_parameters()) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      expected.emplace_back(item.key(), item.value().detach().clone());
    }
  }
  std::string worst;
  EXPECT_LE(max_relative_difference(named(*net), expected, &worst), kTolerance) << worst;
}
INSTANTIATE_TEST_SUITE_P(Calls, TiedSiblings,
                         ::testing::Values(PairCalls::kOnce, PairCalls::kFirstTwice, PairCalls::kSecondSkipped),
                         [](const auto& info) {
                           switch (info.param) {
                             case PairCalls::kOnce: return std::string("once");
                             case PairCalls::kFirstTwice: return std::string("first_twice");
                             case PairCalls::kSecondSkipped: return std::string("second_skipped");
                           }
                           return std::string("?");
                         });

// --- refused --------------------------------------------------------------

TEST(AfterSharding, ToAnotherDtypeIsRefusedAndChangesNothing) {
  auto net = sharded_net(ShardingStrategy::kFullShard);
  try {
    net->to(torch::kDouble);
    ADD_FAILURE() << "to(kDouble) after fully_shard was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("its parameters were not converted"), std::string::npos) << e.what();
  }
  net->to(torch::kFloat);  // already fp32: nothing to do, allowed
  net->to(torch::kCPU);
  for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat);
  ShardedLoop loop;
  expect_equal_training(train_sharded(net, loop), train_plain(loop.steps, 1));
}

// [Note: the training state machine]: a unit's state changes through the
// table only. Assigning a state directly does not compile, and a change
// the table does not have is refused, naming both states and the unit.
static_assert(!std::is_assignable_v<TrainingStateMachine&, TrainingState>,
              "a TrainingState must not be assignable to a unit's state machine");
static_assert(!std::is_constructible_v<TrainingStateMachine, TrainingState>,
              "a unit's state machine starts idle, not from a given state");

TEST(TrainingStateMachine, RefusesEveryTransitionOutsideTheTable) {
  using S = TrainingState;
  const S all[] = {S::kIdle, S::kForward, S::kPreBackward, S::kPostBackward};
  // The table of [Note: the training state machine], row by row (from), with
  // the recomputation-only entry (post_backward -> pre_backward) apart.
  const std::set<std::pair<S, S>> allowed = {
      {S::kIdle, S::kForward},           {S::kIdle, S::kPreBackward},          {S::kIdle, S::kPostBackward},
      {S::kIdle, S::kIdle},              {S::kForward, S::kIdle},              {S::kPreBackward, S::kPreBackward},
      {S::kPreBackward, S::kPostBackward}, {S::kPreBackward, S::kIdle},        {S::kPostBackward, S::kIdle}};
  const auto reach = [](TrainingStateMachine& m, S state) {
    m.enter_idle();
    if (state == S::kForward) m.enter(S::kForward, false, "h.0", "forward");
    if (state == S::kPreBackward) m.enter(S::kPreBackward, false, "h.0", "backward");
    if (state == S::kPostBackward) m.enter(S::kPostBackward, false, "h.0", "backward");
  };
  for (S from : all) {
    for (S to : all) {
      TrainingStateMachine m;
      reach(m, from);
      ASSERT_EQ(m.get(), from);
      if (allowed.count({from, to}) != 0) {
        EXPECT_NO_THROW(m.enter(to, false, "h.0", "backward")) << to_string(from) << " -> " << to_string(to);
        EXPECT_EQ(m.get(), to);
        continue;
      }
      try {
        m.enter(to, false, "h.0", "backward");
        ADD_FAILURE() << to_string(from) << " -> " << to_string(to) << " was allowed";
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(std::string("from ") + to_string(from) + " to " + to_string(to)), std::string::npos)
            << what;
        EXPECT_NE(what.find("unit h.0"), std::string::npos) << what;
        EXPECT_EQ(m.get(), from) << "a refused transition changed the state";
      }
    }
  }
  // Only a recomputation inside backward enters pre_backward from post_backward.
  TrainingStateMachine m;
  reach(m, S::kPostBackward);
  EXPECT_NO_THROW(m.enter(S::kPreBackward, /*recomputing=*/true, "h.0", "backward"));
}

// [Note: the tree's phase]: the same for the tree. The phase has no setter,
// and a change outside the table is refused naming both phases.
TEST(TreeIteration, RefusesEveryPhaseChangeOutsideTheTable) {
  using P = TreePhase;
  const P all[] = {P::kIdle, P::kForward, P::kBackward};
  // The table, row by row (from): only idle opens an iteration (a new
  // one resets an open one to idle first); idle and forward begin a
  // backward; only a backward ends in idle.
  const std::set<std::pair<P, P>> allowed = {{P::kIdle, P::kForward}, {P::kIdle, P::kBackward},
                                             {P::kForward, P::kBackward}, {P::kBackward, P::kIdle}};
  const auto reach = [](TreeIteration& it, P phase) {
    it.reset();
    if (phase != P::kIdle) it.enter(phase);
  };
  for (P from : all) {
    for (P to : all) {
      TreeIteration it;
      reach(it, from);
      ASSERT_EQ(it.phase(), from);
      if (allowed.count({from, to}) != 0) {
        EXPECT_NO_THROW(it.enter(to)) << to_string(from) << " -> " << to_string(to);
        EXPECT_EQ(it.phase(), to);
        continue;
      }
      try {
        it.enter(to);
        ADD_FAILURE() << to_string(from) << " -> " << to_string(to) << " was allowed";
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(std::string("from phase ") + to_string(from) + " to " + to_string(to)), std::string::npos)
            << what;
        EXPECT_EQ(it.phase(), from) << "a refused change moved the phase";
      }
    }
  }
  // reset() goes back to idle from any phase, for the paths that must not throw.
  TreeIteration it;
  it.enter(P::kForward);
  it.enter(P::kBackward);
  it.reset();
  EXPECT_EQ(it.phase(), P::kIdle);
}

}  // namespace
}  // namespace fsdp::testing::fsdp2_api_test
