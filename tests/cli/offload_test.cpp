// `fsdp train --cpu-offload` and `--optimizer-offload` as a user runs them:
// each trains the losses of the run without offload, bit for bit, with
// what the trainer adds around the core (activation checkpointing,
// accumulation, clipping, LoRA's frozen bf16 base beside fp32 adapters);
// their checkpoints resume exactly, and resume without offload at another
// world size (and the reverse); the run's own accounting puts the state on
// the host, as `fsdp plan` says; both together are refused.

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_paths.h"
#include "run_command.h"
#include "train_support.h"

namespace fsdp::testing::offload_cli_test {
namespace {

const std::string kCli = kCliProgram;

CommandResult train(int world, const std::string& args) {
  return run_command(kCli + " launch -n " + std::to_string(world) + " -- " + kCli + " train --log-every 1 " +
                     "--tensorboard=false " + args);
}

// The last metrics line holding `key`.
nlohmann::json last_with(const std::vector<nlohmann::json>& lines, const std::string& key) {
  nlohmann::json out;
  for (const auto& l : lines) {
    if (l.contains(key)) out = l;
  }
  return out;
}

void expect_same_losses(const std::vector<double>& actual, const std::vector<double>& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_EQ(actual[i], expected[i]) << what << ", step " << i + 1;
}

TEST(Offload, EachModeTrainsTheLossesOfTheRunWithoutItBitForBit) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  struct Job {
    std::string name;
    std::string flags;
  };
  const std::vector<Job> jobs = {
      {"ac_accum_clip", "--model llama-tiny --activation-checkpoint --grad-accum 2 --grad-clip 0.5 --dropout 0.1"},
      {"lora_bf16", "--model llama-tiny --precision bf16 --lora-rank 4 --lora-targets q_proj,v_proj --grad-clip 1"},
  };
  for (const auto& job : jobs) {
    const std::string common = job.flags + " --data " + corpus + " --steps 3 --seq-len 16 --batch-size 2 --lr 1e-2";
    std::vector<std::vector<double>> losses;
    std::vector<nlohmann::json> last;
    for (const std::string mode : {"", " --cpu-offload", " --optimizer-offload"}) {
      const std::string out = dir + "/" + job.name + std::to_string(losses.size());
      const auto r = train(2, common + mode + " --out-dir " + out);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const auto metrics = read_metrics(out + "/metrics.jsonl");
      losses.push_back(train_losses(metrics));
      last.push_back(last_with(metrics, "host_state_mb"));
    }
    ASSERT_EQ(losses[0].size(), 3u) << job.name;
    expect_same_losses(losses[1], losses[0], job.name + " --cpu-offload");
    expect_same_losses(losses[2], losses[0], job.name + " --optimizer-offload");
    // The same state, now on the host: all of it (parameters and AdamW's
    // moments; gradients are dropped after the step) under --cpu-offload,
    // AdamW's moments alone under --optimizer-offload.
    const double state = last[0]["sharded_state_mb"].get<double>();
    EXPECT_EQ(last[0]["host_state_mb"].get<double>(), 0.0) << job.name;
    EXPECT_EQ(last[1]["sharded_state_mb"].get<double>(), state) << job.name;
    EXPECT_EQ(last[1]["host_state_mb"].get<double>(), state) << job.name;
    EXPECT_GT(last[2]["host_state_mb"].get<double>(), 0.0) << job.name;
    EXPECT_LT(last[2]["host_state_mb"].get<double>(), state) << job.name;
    // What the compute side allocated at most goes down as state moves out.
    EXPECT_LT(last[1]["allocated_peak_mb"].get<double>(), last[0]["allocated_peak_mb"].get<double>()) << job.name;
    EXPECT_LT(last[2]["allocated_peak_mb"].get<double>(), last[0]["allocated_peak_mb"].get<double>()) << job.name;
  }
}

// A checkpoint records where nothing lives: one saved under offload
// resumes without it, at another world size, and the reverse, each equal
// to the same schedule of runs without offload.
TEST(Offload, CheckpointsResumeExactlyAndAcrossModesAndWorldSizes) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  const std::string common = "--model gpt2-tiny --data " + corpus + " --seq-len 16 --lr 2e-3 --grad-clip 1 --steps 4";
  // `first` for steps 1-2 at W = 2 (batch 2), then `second` for 3-4 at
  // `world` (the same global batch of 4 rows).
  const auto schedule = [&](const std::string& name, const std::string& first, int world, const std::string& second) {
    const std::string ckpt = dir + "/" + name + "_ckpt";
    const std::string metrics = dir + "/" + name + ".jsonl";
    auto a = train(2, common + " --batch-size 2 --set runtime.steps=2 --save-every 2 --ckpt-dir " + ckpt +
                          " --metrics " + metrics + first);
    EXPECT_EQ(a.exit_code, 0) << a.output;
    auto b = train(world, common + " --batch-size " + std::to_string(4 / world) + " --resume --ckpt-dir " + ckpt +
                              " --metrics " + metrics + second);
    EXPECT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find("resumed from"), std::string::npos) << b.output;
    return train_losses(read_metrics(metrics));
  };
  // Exactly at the same world size and mode, against one uninterrupted run.
  const auto whole = train(2, common + " --batch-size 2 --cpu-offload --metrics " + dir + "/whole.jsonl");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  expect_same_losses(schedule("same", " --cpu-offload", 2, " --cpu-offload"),
                     train_losses(read_metrics(dir + "/whole.jsonl")), "resumed under --cpu-offload");
  for (int world : {1, 4}) {
    const auto plain = schedule("plain" + std::to_string(world), "", world, "");
    ASSERT_EQ(plain.size(), 4u);
    expect_same_losses(schedule("from_cpu" + std::to_string(world), " --cpu-offload", world, ""), plain,
                       "saved with --cpu-offload, resumed without at W = " + std::to_string(world));
    expect_same_losses(schedule("to_cpu" + std::to_string(world), "", world, " --cpu-offload"), plain,
                       "saved without, resumed with --cpu-offload at W = " + std::to_string(world));
    expect_same_losses(schedule("from_opt" + std::to_string(world), " --optimizer-offload", world, ""), plain,
                       "saved with --optimizer-offload, resumed without at W = " + std::to_string(world));
  }
}

TEST(OffloadErrors, BothModesTogetherAreRefusedBeforeAnythingIsWritten) {
  const auto dir = make_temp_dir();
  const auto r = run_command(kCli + " train --model gpt2-tiny --steps 1 --cpu-offload --optimizer-offload --out-dir " +
                             dir + "/never");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fsdp.cpu_offload and fsdp.optimizer_offload are both set"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("frame #"), std::string::npos) << r.output;
  EXPECT_FALSE(exists(dir + "/never")) << "nothing may be written on bad input";
  // The same from YAML.
  const auto yaml = dir + "/both.yaml";
  ASSERT_EQ(run_command("printf 'fsdp:\\n  cpu_offload: true\\n  optimizer_offload: true\\n' > " + yaml).exit_code, 0);
  const auto y = run_command(kCli + " train --model gpt2-tiny --steps 1 --config " + yaml + " --out-dir " + dir + "/never");
  EXPECT_NE(y.exit_code, 0) << y.output;
  EXPECT_NE(y.output.find("fsdp.cpu_offload and fsdp.optimizer_offload are both set"), std::string::npos) << y.output;
  EXPECT_FALSE(exists(dir + "/never"));
}

// --overlap-host-step starts each unit's update on the host as its
// gradients land there, during backward: the same fused update, unit by
// unit, so the losses are the step-after-backward run's bit for bit, with
// accumulation (micro-steps before the last update nothing).
TEST(Offload, OverlappedHostStepTrainsAsTheStepAfterBackward) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  const std::string common = "--model llama-tiny --data " + corpus + " --steps 4 --seq-len 16 --batch-size 2 "
                             "--grad-accum 2 --grad-clip 0 --lr 1e-2 --cpu-offload";
  const auto after = train(2, common + " --out-dir " + dir + "/after");
  const auto overlapped = train(2, common + " --overlap-host-step --out-dir " + dir + "/overlapped");
  ASSERT_EQ(after.exit_code, 0) << after.output;
  ASSERT_EQ(overlapped.exit_code, 0) << overlapped.output;
  const auto a = train_losses(read_metrics(dir + "/after/metrics.jsonl"));
  ASSERT_EQ(a.size(), 4u);
  expect_same_losses(train_losses(read_metrics(dir + "/overlapped/metrics.jsonl")), a, "--overlap-host-step");
  EXPECT_LT(a.back(), a.front());
}

// A failure in one rank's host step (injected on rank 1 at step 3: the
// whole step, or its second unit's update when overlapped) stops every rank with it, saying so, and saves
// nothing past the last checkpoint; resumed from there, the run ends as
// one that never failed: nothing was left half-updated in a checkpoint.
TEST(OffloadErrors, AFailedHostStepIsReportedOnEveryRankAndTheRunResumesFromItsLastCheckpoint) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  const std::string common = "--model gpt2-tiny --data " + corpus + " --steps 4 --seq-len 16 --batch-size 2 "
                             "--grad-clip 0 --lr 2e-3 --cpu-offload --save-every 1";
  for (const std::string overlap : {"", " --overlap-host-step"}) {
    const std::string name = overlap.empty() ? "after" : "overlapped";
    const auto whole = train(2, common + overlap + " --out-dir " + dir + "/" + name + "_whole");
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    // Steps 1 and 2 take visits 1-2 (after backward: one visit a step) or
    // 1-6 (overlapped: each of gpt2-tiny's 3 units a step); overlapped, the
    // failure comes at step 3's second unit, after its first was updated.
    const std::string visit = overlap.empty() ? "3" : "8";
    const std::string run = kCli + " train --log-every 1 --tensorboard=false " + common + overlap + " --out-dir " +
                            dir + "/" + name;
    const auto failed = run_command(kCli + " launch -n 2 -- bash -c 'if [ \"$RANK\" = 1 ]; then export " +
                                    "FSDP_FAULT_POINT=train.host_step@" + visit + ":THROW; fi; exec " + run + "'");
    EXPECT_NE(failed.exit_code, 0) << failed.output;
    EXPECT_NE(failed.output.find("[rank 1] error: the optimizer's step on the host failed: fault point train.host_step"),
              std::string::npos) << failed.output;
    EXPECT_NE(failed.output.find("[rank 0] error: the optimizer's step on the host failed on another rank"), std::string::npos)
        << failed.output;
    std::ifstream latest(dir + "/" + name + "/checkpoints/latest");
    std::string step;
    std::getline(latest, step);
    EXPECT_EQ(step, "step_00000002") << name;
    const auto resumed = train(2, common + overlap + " --out-dir " + dir + "/" + name);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    const auto expected = train_losses(read_metrics(dir + "/" + name + "_whole/metrics.jsonl"));
    const auto actual = train_losses(read_metrics(dir + "/" + name + "/metrics.jsonl"));
    ASSERT_EQ(expected.size(), 4u);
    // The failed start logged steps 1-2 and never step 3; the resume logs 3-4.
    expect_same_losses(actual, expected, name + " resumed after the failure");
  }
}

TEST(OffloadErrors, AnOverlappedHostStepWithWhatDecidesAfterBackwardIsRefused) {
  const auto dir = make_temp_dir();
  const auto refused = [&](const std::string& flags, const std::string& needle) {
    const auto r = run_command(kCli + " train --model gpt2-tiny --steps 1 " + flags + " --out-dir " + dir + "/never");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << flags << "\n" << r.output;
    EXPECT_FALSE(exists(dir + "/never"));
  };
  refused("--overlap-host-step --grad-clip 0", "add --cpu-offload");
  refused("--overlap-host-step --cpu-offload", "clipping needs that norm first");
  refused("--overlap-host-step --cpu-offload --grad-clip 0 --skip-spikes 4", "guard.skip_spikes");
}

}  // namespace
}  // namespace fsdp::testing::offload_cli_test
