// What the event log and the buffer accounting show: gathers issued ahead of
// use (prefetch), reductions bounded in backward, HSDP's replica all-reduce
// overlapping backward, FSDP ranges in a profiler trace; plus clipping across
// shard groups and sync_module_states for buffers and ignored parameters.

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include "../distributed/dist_test_world.h"
#include "adapter_net.h"
#include "core/fsdp_state.h"
#include "fsdp/core/grad_norm.h"
#include "fsdp/core/memory.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp_test_support.h"

namespace fsdp::testing::fsdp_overlap_memory_test {
namespace {


AdapterNet sharded_net(const AdapterNetConfig& c, const FullyShardOptions& options) {
  auto net = make_adapter_net(c, kInitSeed);
  for (auto& b : net->blocks) fully_shard(b, options);
  fully_shard(net, options);
  return net;
}

// The prefetch tests' model (four blocks) and the usual FULL_SHARD options.
constexpr int kPrefetchBlocks = 4;
AdapterNetConfig four_blocks() {
  AdapterNetConfig c;
  c.blocks = kPrefetchBlocks;
  return c;
}
FullyShardOptions full_shard_options() {
  FullyShardOptions options;
  options.mesh = mesh_for(ShardingStrategy::kFullShard);
  return options;
}

// One training step's events (forward, backward, optimizer step).
std::vector<FSDPEvent> step_events(AdapterNet& net, torch::optim::Optimizer& optimizer, int step) {
  clear_event_log(*net);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(step + 11);
  torch::Tensor x = torch::randn({4, net->config.dim}, gen);
  fsdp::call(net, x).pow(2).mean().backward();
  optimizer.step();
  optimizer.zero_grad();
  return event_log(*net);
}

int64_t position(const std::vector<FSDPEvent>& events, FSDPEvent::Kind kind, const std::string& unit, int nth = 0) {
  for (const auto& e : events) {
    if (e.kind == kind && e.unit == unit && nth-- == 0) return e.sequence;
  }
  return -1;
}

std::string block(int i) { return "b" + std::to_string(i); }

// Forward: block i+1's gather is issued before block i's forward ends.
// Backward: the last block's gather is issued before its backward starts
// (from the root's pre-backward), and block i-1's before block i's
// backward ends.
void expect_prefetched(const std::vector<FSDPEvent>& events, int blocks) {
  using K = FSDPEvent::Kind;
  for (int i = 0; i + 1 < blocks; ++i) {
    const int64_t gather = position(events, K::kAllGather, block(i + 1));
    const int64_t end = position(events, K::kPostForward, block(i));
    ASSERT_GE(gather, 0) << "no all-gather for " << block(i + 1);
    EXPECT_LT(gather, end) << block(i + 1) << " gathered after " << block(i) << "'s forward ended";
  }
  const int last = blocks - 1;
  const int64_t gather_last = position(events, K::kAllGather, block(last), 1);  // its second gather: for backward
  ASSERT_GE(gather_last, 0);
  EXPECT_LT(gather_last, position(events, K::kPreBackward, block(last))) << "the last block was not prefetched";
  for (int i = last; i >= 1; --i) {
    const int64_t gather = position(events, K::kAllGather, block(i - 1), 1);
    const int64_t end = position(events, K::kPostBackward, block(i));
    ASSERT_GE(gather, 0);
    EXPECT_LT(gather, end) << block(i - 1) << " gathered for backward after " << block(i) << "'s backward ended";
  }
}

TEST(Prefetch, NextUnitIsGatheredBeforeTheCurrentOneFinishes) {
  if (test_world().size() == 1) GTEST_SKIP() << "one rank gathers nothing";
  const AdapterNetConfig c = four_blocks();
  const FullyShardOptions options = full_shard_options();
  auto net = sharded_net(c, options);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
  // Step 1 records the order (module order stands in); step 2 uses it.
  expect_prefetched(step_events(net, optimizer, 0), kPrefetchBlocks);
  expect_prefetched(step_events(net, optimizer, 1), kPrefetchBlocks);
}

TEST(Prefetch, ExplicitListsAndDepthTwo) {
  if (test_world().size() == 1) GTEST_SKIP() << "one rank gathers nothing";
  const AdapterNetConfig c = four_blocks();
  FullyShardOptions options = full_shard_options();
  {
    auto net = sharded_net(c, options);
    auto& b = net->blocks;
    for (size_t i = 0; i + 1 < b.size(); ++i) set_modules_to_forward_prefetch(*b[i], {b[i + 1].get()});
    for (size_t i = 1; i < b.size(); ++i) set_modules_to_backward_prefetch(*b[i], {b[i - 1].get()});
    set_modules_to_backward_prefetch(*net, {b.back().get()});
    torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
    step_events(net, optimizer, 0);
    expect_prefetched(step_events(net, optimizer, 1), kPrefetchBlocks);
  }
  options.prefetch_depth = 2;
  auto net = sharded_net(c, options);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
  step_events(net, optimizer, 0);
  const auto events = step_events(net, optimizer, 1);
  // Depth 2: block 2 is gathered before block 0's forward ends.
  EXPECT_LT(position(events, FSDPEvent::Kind::kAllGather, "b2"), position(events, FSDPEvent::Kind::kPostForward, "b0"));
}

TEST(BackwardMemory, BoundedByTwoUnitsOfGradientAndCommunicationBuffers) {
  AdapterNetConfig c;
  c.blocks = 8;
  c.dim = 61;
  const FullyShardOptions options = full_shard_options();
  auto net = sharded_net(c, options);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
  const auto* root = detail::state_of(*net)->group();
  const auto* unit = detail::state_of(*net->blocks[0])->group();
  const int64_t bound = root->gathered_bytes() + (1 + options.prefetch_depth) * unit->gathered_bytes() +
                        2 * std::max(unit->reduction_bytes(), root->reduction_bytes());
  int64_t all_units = 0;
  for (auto& b : net->blocks) all_units += detail::state_of(*b)->group()->reduction_bytes();
  for (int step = 0; step < 3; ++step) {
    torch::Tensor loss = fsdp::call(net, torch::randn({4, c.dim})).pow(2).mean();
    memory::reset_peak();
    loss.backward();
    const MemoryStats stats = memory_stats(*net, &optimizer);
    EXPECT_LE(stats.peak_transient_bytes, bound)
        << "step " << step << ": gathered " << stats.peak_gathered_bytes << ", gradients "
        << stats.peak_unsharded_grad_bytes << ", communication " << stats.peak_comm_bytes;
    EXPECT_EQ(stats.comm_bytes, 0) << "communication buffers left after backward";
    EXPECT_EQ(stats.unsharded_grad_bytes, 0) << "unsharded gradients left after backward";
    optimizer.step();
    optimizer.zero_grad();
  }
  if (test_world().size() > 1) {
    EXPECT_LT(bound, all_units) << "the model is too small for the bound to mean anything";
  }
}

TEST(HybridShard, ReplicaAllReduceOverlapsBackward) {
  const int f = hybrid_fsdp_size(test_world().size());
  if (f == 0) GTEST_SKIP() << "hybrid_shard runs at world sizes 2 and 4";
  AdapterNetConfig c;
  c.blocks = 4;
  FullyShardOptions options;
  options.mesh = mesh_for(ShardingStrategy::kHybridShard);
  options.strategy = ShardingStrategy::kHybridShard;
  auto net = sharded_net(c, options);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
  const auto events = step_events(net, optimizer, 0);
  const int64_t first_all_reduce = position(events, FSDPEvent::Kind::kAllReduce, "b3");
  ASSERT_GE(first_all_reduce, 0) << "no replica all-reduce";
  // Issued while backward still runs: before block 0's backward ends.
  EXPECT_LT(first_all_reduce, position(events, FSDPEvent::Kind::kPostBackward, "b0"));
}

TEST(HybridShard, NoSyncAccumulationUnderMixedPrecision) {
  if (hybrid_fsdp_size(test_world().size()) == 0) GTEST_SKIP() << "hybrid_shard runs at world sizes 2 and 4";
  RunSpec spec;
  spec.strategy = ShardingStrategy::kHybridShard;
  spec.compute_dtype = torch::kBFloat16;
  spec.grad_accum = 2;
  spec.sync_each_micro_step = false;
  std::string worst;
  EXPECT_LE(max_relative_difference(train_sharded(spec), train_reference(spec), &worst), 1e-5) << worst;
}

TEST(Profiler, FsdpRangesAppearInATrace) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("fsdp_trace_" + std::to_string(::getpid()) + "_" + std::to_string(test_world().rank()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "trace.json").string();
  AdapterNetConfig c;
  const FullyShardOptions options = full_shard_options();
  auto net = sharded_net(c, options);
  {
    torch::autograd::profiler::RecordProfile profile(path);
    fsdp::call(net, torch::randn({4, c.dim})).pow(2).mean().backward();
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<std::string> ranges{"FSDP::pre_forward", "FSDP::post_forward", "FSDP::pre_backward",
                                  "FSDP::post_backward"};
  if (test_world().size() > 1) {
    ranges.push_back("FSDP::all_gather");
    ranges.push_back("FSDP::reduce_scatter");
  }
  for (const auto& r : ranges) EXPECT_NE(text.str().find(r), std::string::npos) << r << " missing from " << path;
  std::filesystem::remove_all(dir);
}

TEST(GradNorm, UnitsInDifferentShardGroups) {
  if (hybrid_fsdp_size(test_world().size()) == 0) GTEST_SKIP() << "needs a second shard group shape (W = 2 or 4)";
  const int w = test_world().size();
  const int rank = test_world().rank();
  AdapterNetConfig c;
  auto net = make_adapter_net(c, kInitSeed);
  FullyShardOptions full;
  full.mesh = mesh_for(ShardingStrategy::kFullShard);
  FullyShardOptions hybrid;
  hybrid.mesh = mesh_for(ShardingStrategy::kHybridShard);
  hybrid.strategy = ShardingStrategy::kHybridShard;
  fully_shard(net->blocks[0], full);
  fully_shard(net->blocks[1], hybrid);
  fully_shard(net->blocks[2], hybrid);
  fully_shard(net, full);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  torch::Tensor x = torch::randn({2 * w, c.dim}, gen);
  fsdp::call(net, x.narrow(0, 2 * rank, 2)).pow(2).mean().backward();
  const double norm = clip_grad_norm_(*net, 0.0);

  auto ref = make_adapter_net(c, kInitSeed);
  ref->forward(x).pow(2).mean().backward();
  double sq = 0;
  for (const auto& p : unique_parameters(*ref)) sq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  EXPECT_NEAR(norm, std::sqrt(sq), 1e-5 * std::sqrt(sq));
}

TEST(SyncModuleStates, BroadcastsBuffersAndIgnoredParameters) {
  struct WithStateImpl : torch::nn::Module {
    WithStateImpl() {
      const double r = fsdp::testing::test_world().rank();
      weight = register_parameter("weight", torch::full({5}, 1.0 + r));
      scale = register_parameter("scale", torch::full({3}, 10.0 + r));  // ignored
      stats = register_buffer("stats", torch::full({4}, 100.0 + r));
    }
    torch::Tensor weight, scale, stats;
  };
  auto m = std::make_shared<WithStateImpl>();
  FullyShardOptions options = full_shard_options();
  options.sync_module_states = true;
  options.ignored_params = {m->scale};
  fully_shard(*m, options);
  EXPECT_TRUE(m->stats.equal(torch::full({4}, 100.0)));
  EXPECT_TRUE(m->scale.equal(torch::full({3}, 10.0)));
  for (const auto& [name, value] : full_parameters(*m)) {
    if (name == "weight") {
      EXPECT_TRUE(value.equal(torch::full({5}, 1.0)));
    }
  }
}

// Every collective a tree issues is in its event log (fsdp_collectives.h):
// the start-up broadcasts of the units sharded before the root (under the
// names the root gives them), the end of backward's agreement on used
// parameters, and full_parameters' gathers.
TEST(EventLog, HoldsStartUpBroadcastsTheUsedParameterAgreementAndStateDictGathers) {
  using K = FSDPEvent::Kind;
  if (test_world().size() == 1) GTEST_SKIP() << "one rank broadcasts and agrees on nothing";
  const int world = test_world().size();
  FullyShardOptions options = full_shard_options();
  options.sync_module_states = true;
  auto net = sharded_net(four_blocks(), options);

  const auto count = [](const std::vector<FSDPEvent>& events, K kind, const std::string& unit) {
    return std::count_if(events.begin(), events.end(),
                         [&](const FSDPEvent& e) { return e.kind == kind && e.unit == unit; });
  };
  // One broadcast over the shard group per parameter (the mesh has no
  // replicas), block by block in the order they were sharded, the root's last.
  const auto startup = event_log(*net);
  int64_t previous = -1;
  for (int i = 0; i < kPrefetchBlocks; ++i) {
    EXPECT_EQ(count(startup, K::kBroadcast, block(i)),
              static_cast<int64_t>(net->blocks[i]->parameters().size())) << block(i);
    const int64_t first = position(startup, K::kBroadcast, block(i));
    EXPECT_GT(first, previous) << block(i) << " was broadcast before the block sharded ahead of it";
    previous = first;
  }
  EXPECT_GT(position(startup, K::kBroadcast, "<root>"), previous);
  for (const auto& e : startup) {
    EXPECT_EQ(e.kind, K::kBroadcast) << to_string(e.kind) << " before any step";
    EXPECT_EQ(e.ranks, world);
    EXPECT_GE(e.waited_s, e.issued_s);
  }

  // A step: the agreement runs once, over the world, after every reduction.
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
  const auto step = step_events(net, optimizer, 0);
  ASSERT_EQ(count(step, K::kUsedParameters, "<root>"), 1);
  const int64_t agreed = position(step, K::kUsedParameters, "<root>");
  for (const auto& e : step) {
    if (e.kind == K::kReduceScatter) {
      EXPECT_LT(e.sequence, agreed) << e.unit;
    }
    if (e.kind == K::kUsedParameters) {
      EXPECT_EQ(e.ranks, world);
      EXPECT_GE(e.waited_s, e.issued_s);
    }
  }

  // full_parameters: one gather per unit with parameters, each waited.
  clear_event_log(*net);
  (void)full_parameters(*net);
  const auto gathers = event_log(*net);
  for (int i = 0; i < kPrefetchBlocks; ++i) EXPECT_EQ(count(gathers, K::kAllGather, block(i)), 1) << block(i);
  EXPECT_EQ(count(gathers, K::kAllGather, "<root>"), 1);
  EXPECT_EQ(static_cast<int64_t>(gathers.size()), kPrefetchBlocks + 1);
  for (const auto& e : gathers) EXPECT_GE(e.waited_s, e.issued_s) << e.unit;
}

// A unit's gather issued before an ancestor is sharded (fsdp::unshard,
// async) and waited after: its entry moved to the root's log with the rest
// of the unit's, and the wait is marked there.
TEST(EventLog, AGatherInFlightWhenItsUnitJoinsARootIsMarkedWaitedInTheRootsLog) {
  using K = FSDPEvent::Kind;
  if (test_world().size() == 1) GTEST_SKIP() << "one rank gathers nothing";
  auto net = make_adapter_net(four_blocks(), kInitSeed);
  const FullyShardOptions options = full_shard_options();
  for (auto& b : net->blocks) fully_shard(b, options);
  UnshardHandle pending = unshard(*net->blocks[1], /*async_op=*/true);
  fully_shard(net, options);
  pending.wait();
  const auto events = event_log(*net);
  const int64_t gather = position(events, K::kAllGather, block(1));
  ASSERT_GE(gather, 0) << "the block's gather did not follow it into the root's log";
  for (const auto& e : events) {
    if (e.sequence == gather) {
      EXPECT_GE(e.waited_s, e.issued_s) << "its wait was not marked";
    }
  }
  reshard(*net->blocks[1]);
}

TEST(Collectives, MovedWorkHandleIsWaitedOnceByItsNewOwner) {
  auto& group = test_world().group();
  torch::Tensor t = torch::full({3}, static_cast<double>(group.rank()));
  dist::Work first = dist::broadcast(group, t, 0);
  dist::Work second(std::move(first));
  EXPECT_TRUE(first.done());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  second.wait();
  EXPECT_TRUE(t.equal(torch::zeros({3})));
  dist::Work third;
  third = std::move(second);
  EXPECT_TRUE(second.done());  // NOLINT(bugprone-use-after-move)
}

}  // namespace
}  // namespace fsdp::testing::fsdp_overlap_memory_test
