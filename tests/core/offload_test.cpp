// Offload changes where state lives, never what is computed: CPU offload of
// every unit (OffloadPolicy::cpu()) and the optimizer's state on the host
// (FusedAdamW::set_state_offload) train bit for bit as the same run without
// them, under every strategy, with accumulation and clipping, at the test
// world's size; the host side is storage of its own, the accounting shows
// the sharded state gone from the compute side, and the runs still match
// one process (fsdp_equivalence_test's tolerance).

#include <gtest/gtest.h>

#include "../distributed/dist_test_world.h"
#include "fsdp_test_support.h"

namespace fsdp::testing::offload_test {
namespace {

constexpr double kFp32Tolerance = 1e-5;

enum class Mode { kCpu, kOptimizer };

struct Case {
  ShardingStrategy strategy;
  bool bf16;
  Mode mode;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(to_string(info.param.strategy)) + (info.param.bf16 ? "_bf16" : "_fp32") +
         (info.param.mode == Mode::kCpu ? "_cpu_offload" : "_optimizer_offload");
}

bool runs_here(ShardingStrategy s) {
  return s != ShardingStrategy::kHybridShard || hybrid_fsdp_size(test_world().size()) > 0;
}

// `spec` with the case's offload on. The optimizer is FusedAdamW in both
// runs, so the only difference is where state lives.
RunSpec offloaded(RunSpec spec, Mode mode) {
  if (mode == Mode::kCpu) spec.offload = OffloadPolicy::cpu();
  if (mode == Mode::kOptimizer) spec.optimizer_offload = true;
  return spec;
}

void expect_bit_equal(const NamedTensors& actual, const NamedTensors& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_EQ(actual[i].first, expected[i].first);
    EXPECT_TRUE(actual[i].second.equal(expected[i].second)) << actual[i].first << " differs";
  }
}

class OffloadEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(OffloadEquivalence, TrainsBitForBitAsWithoutOffload) {
  const auto [strategy, bf16, mode] = GetParam();
  if (!runs_here(strategy)) GTEST_SKIP() << "hybrid_shard runs at world sizes 2 and 4";
  RunSpec spec;
  spec.strategy = strategy;
  spec.compute_dtype = bf16 ? torch::kBFloat16 : torch::kFloat;
  spec.weight_decay = 0.1;
  spec.fused_adamw = true;
  ShardedRunLog plain_log, log;
  const auto plain = train_sharded(spec, &plain_log);
  const auto moved = train_sharded(offloaded(spec, mode), &log);
  expect_bit_equal(moved, plain);
  // The premise: the run trains (and matches one process).
  std::string worst;
  EXPECT_LE(max_relative_difference(moved, train_reference(spec), &worst), kFp32Tolerance) << worst;

  const MemoryStats& s = log.stats_after_first_step;
  EXPECT_GT(s.optimizer_state_bytes, 0);
  EXPECT_EQ(s.host_optimizer_state_bytes, s.optimizer_state_bytes) << "AdamW's moments live on the host";
  EXPECT_EQ(plain_log.stats_after_first_step.host_optimizer_state_bytes, 0);
  EXPECT_EQ(plain_log.stats_after_first_step.host_param_bytes, 0);
  EXPECT_FALSE(plain_log.any_param_on_host);
  if (mode == Mode::kCpu) {
    // Between uses the compute side holds nothing of the unit: parameters,
    // gradients and state are all host buffers, gathered buffers are freed.
    EXPECT_GT(s.sharded_param_bytes, 0);
    EXPECT_EQ(s.host_param_bytes, s.sharded_param_bytes);
    EXPECT_GT(s.grad_bytes, 0);
    EXPECT_EQ(s.host_grad_bytes, s.grad_bytes);
    EXPECT_TRUE(log.params_on_host);
  } else {
    EXPECT_EQ(s.host_param_bytes, 0);
    EXPECT_EQ(s.host_grad_bytes, 0);
    EXPECT_FALSE(log.any_param_on_host);
  }
  for (int64_t held : log.gathered_after_step) EXPECT_EQ(held, 0);
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (Mode mode : {Mode::kCpu, Mode::kOptimizer}) {
    for (bool bf16 : {false, true}) {
      for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                 ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard}) {
        out.push_back({s, bf16, mode});
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Strategies, OffloadEquivalence, ::testing::ValuesIn(all_cases()), case_name);

// Accumulation without sync keeps its gradients on the compute side and
// reduces once; with sync each micro-step's reduced gradients are added
// into the host's. Clipping reads the host's gradients for its norm.
TEST(Offload, AccumulationAndClippingTrainAsWithout) {
  for (Mode mode : {Mode::kCpu, Mode::kOptimizer}) {
    for (bool sync_each : {false, true}) {
      RunSpec spec;
      spec.fused_adamw = true;
      spec.grad_accum = 2;
      spec.sync_each_micro_step = sync_each;
      spec.clip = 0.5;  // clips every step (fsdp_equivalence_test's premise)
      ShardedRunLog plain_log, log;
      const auto plain = train_sharded(spec, &plain_log);
      expect_bit_equal(train_sharded(offloaded(spec, mode), &log), plain);
      ASSERT_EQ(log.grad_norms.size(), plain_log.grad_norms.size());
      for (size_t i = 0; i < log.grad_norms.size(); ++i) {
        EXPECT_EQ(log.grad_norms[i], plain_log.grad_norms[i]) << "step " << i;
        EXPECT_GT(log.grad_norms[i], spec.clip);
      }
    }
  }
}

// torch's own AdamW (op by op, not the fused loop) steps CPU-offloaded
// shards on the host as well: the offload is the core's, not the optimizer's.
TEST(Offload, CpuOffloadUnderTorchsAdamWTrainsAsWithout) {
  RunSpec spec;
  const auto plain = train_sharded(spec);
  spec.offload = OffloadPolicy::cpu();
  expect_bit_equal(train_sharded(spec), plain);
}

}  // namespace
}  // namespace fsdp::testing::offload_test
