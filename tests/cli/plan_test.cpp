// fsdp plan against the trainer's own accounting of tensor memory (every
// CPU block the allocator hands out), the memory snapshot against the same
// accounting, the budget search against a run of what it chose, and the
// plan's refusals.

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_paths.h"
#include "run_command.h"
#include "train_support.h"

namespace fsdp::testing::plan_test {
namespace {

const std::string kCli = kCliProgram;
constexpr double kMiB = 1 << 20;

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("fsdp_plan_test_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

nlohmann::json plan_json(const std::string& flags) {
  const auto r = run_command(kCli + " plan --json " + flags);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output);
}

// The last metrics line of a 3-step run with `flags` on `world` ranks.
nlohmann::json train_metrics(const std::string& name, const std::string& flags, int world = 1,
                             const std::string& extra = "") {
  const std::string dir = temp_dir(name);
  const std::string train =
      kCli + " train " + flags + " --steps 3 --log-every 1 --tensorboard=false --out-dir " + dir + "/run " + extra;
  const auto r = run_command(world == 1 ? "OMP_NUM_THREADS=1 " + train
                                        : kCli + " launch -n " + std::to_string(world) + " -- " + train);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const auto lines = read_metrics(dir + "/run/metrics.jsonl");
  EXPECT_FALSE(lines.empty());
  return lines.empty() ? nlohmann::json::object() : lines.back();
}

struct PlanCase {
  std::string name;
  int world;
  std::string flags;
};

class PlanAgainstAccounting : public ::testing::TestWithParam<PlanCase> {};

// The prediction is computed from shapes alone; the measurement counts every
// tensor block the trainer allocated. Within 10% (the bound) of the
// peak, and the sharded parameters and AdamW state to the byte.
TEST_P(PlanAgainstAccounting, TensorPeakWithinTenPercentAndShardedStateToTheByte) {
  const auto& c = GetParam();
  const std::string flags = "--seq-len 64 --batch-size 4 " + c.flags;
  const auto predicted = plan_json("--world-size " + std::to_string(c.world) + " " + flags);
  const auto measured = train_metrics(c.name, flags, c.world);
  const double predicted_mib = predicted["tensor_peak_bytes"].get<double>() / kMiB;
  const double measured_mib = measured["allocated_peak_mb"].get<double>();
  EXPECT_NEAR(predicted_mib / measured_mib, 1.0, 0.10)
      << c.name << ": predicted " << predicted_mib << " MiB (" << predicted["peak_phase"] << "), measured "
      << measured_mib << " MiB";
  // Gradients are dropped after each step (zero_grad to None): what stays
  // is the shards and AdamW's two moments.
  // To the byte: a missing LayerNorm (a few hundred bytes) or a shard's
  // padding counted wrong shows here.
  // Offloaded state is the host's: absent from the compute side's parts,
  // and in the plan's host parts (gradients aside, as above).
  const auto part = [](const nlohmann::json& parts, const char* name) {
    return parts.contains(name) ? parts[name].get<double>() : 0.0;
  };
  const auto state = std::llround(part(predicted["parts"], "sharded parameters") +
                                  part(predicted["parts"], "optimizer state"));
  const double host_mb = measured["host_state_mb"].get<double>();
  EXPECT_EQ(state, std::llround((measured["sharded_state_mb"].get<double>() - host_mb) * kMiB)) << c.name;
  const auto host = std::llround(part(predicted["host_parts"], "sharded parameters") +
                                 part(predicted["host_parts"], "optimizer state"));
  EXPECT_EQ(host, std::llround(host_mb * kMiB)) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Models, PlanAgainstAccounting,
    ::testing::Values(PlanCase{"gpt2_fp32", 1, "--model gpt2-tiny"},
                      PlanCase{"gpt2_bf16_ac", 1, "--model gpt2-tiny --precision bf16 --activation-checkpoint"},
                      PlanCase{"gpt2_chunked", 1, "--model gpt2-tiny --chunk-loss"},
                      PlanCase{"llama_fp32", 1, "--model llama-tiny"},
                      PlanCase{"llama_bf16_ac", 1, "--model llama-tiny --precision bf16 --activation-checkpoint"},
                      PlanCase{"qwen3_fp32", 1, "--model qwen3-tiny"},
                      PlanCase{"qwen3_bf16", 1, "--model qwen3-tiny --precision bf16"},
                      PlanCase{"gpt2_w2_full_shard", 2, "--model gpt2-tiny --sharding full_shard"},
                      PlanCase{"llama_w2_shard_grad_op_bf16", 2,
                               "--model llama-tiny --sharding shard_grad_op --precision bf16"},
                      PlanCase{"gpt2_w2_no_shard_chunked", 2, "--model gpt2-tiny --sharding no_shard --chunk-loss"},
                      PlanCase{"llama_w2_accumulation_bf16", 2, "--model llama-tiny --grad-accum 3 --precision bf16"},
                      PlanCase{"llama_w2_accumulation_sharded_bf16", 2,
                               "--model llama-tiny --grad-accum 3 --precision bf16 --accumulate sharded"},
                      // A tied head at a large vocabulary: its gradient waits for the embedding's.
                      PlanCase{"qwen3_w2_tied_large_vocab", 2, "--model qwen3-tiny --vocab-size 32000"},
                      // Mixture-of-Experts: routed and shared experts, dense and sparse layers mixed.
                      PlanCase{"qwen3_moe_fp32", 1, "--model qwen3-moe-tiny"},
                      PlanCase{"qwen3_moe_w2_bf16", 2, "--model qwen3-moe-tiny --precision bf16"},
                      PlanCase{"llama4_fp32", 1, "--model llama4-tiny"},
                      PlanCase{"llama4_w2_ac", 2, "--model llama4-tiny --activation-checkpoint"},
                      // LoRA: in fp32 the frozen base shares the adapters' flat shard (gradients and
                      // reductions cover the whole unit); under bf16 it is a bf16 shard of its own,
                      // never reduced. AdamW's state is the adapters' alone either way.
                      PlanCase{"qwen3_lora_fp32", 1, "--model qwen3-tiny --lora-rank 8"},
                      PlanCase{"llama_lora_bf16", 1, "--model llama-tiny --precision bf16 --lora-rank 8"},
                      PlanCase{"llama_w2_lora_bf16_accumulation", 2,
                               "--model llama-tiny --precision bf16 --lora-rank 8 --grad-accum 3"},
                      // Offload: the state on the host; over one rank CPU offload gathers (a copy)
                      // where the shard would otherwise be the unit.
                      PlanCase{"gpt2_cpu_offload", 1, "--model gpt2-tiny --cpu-offload"},
                      PlanCase{"llama_w2_cpu_offload_bf16", 2, "--model llama-tiny --cpu-offload --precision bf16"},
                      PlanCase{"llama_w2_optimizer_offload", 2, "--model llama-tiny --optimizer-offload"}),
    [](const ::testing::TestParamInfo<PlanCase>& info) { return info.param.name; });

// DPO: the plan counts each pair as two rows and, without LoRA, the frozen
// reference's shards; held to a DPO run's own accounting as the cases
// above are. Every answer runs past --seq-len, so each micro-batch is as
// wide as the plan assumes (it plans for --seq-len, the bound).
TEST(PlanAgainstAccounting, DpoCountsTwoRowsAPairAndTheReferencesShards) {
  const auto qwen = std::string(kSourceDir) + "/data/qwen3";
  if (!std::filesystem::is_regular_file(qwen + "/tokenizer.json")) GTEST_SKIP() << qwen << " is missing";
  const std::string dir = temp_dir("dpo");
  write_model_dir("qwen3-tiny", 151936, qwen, dir + "/model");
  {
    std::ofstream pairs(dir + "/pairs.jsonl");
    std::string long_answer;
    for (int k = 0; k < 30; ++k) long_answer += " word" + std::to_string(k);
    for (int k = 0; k < 8; ++k) {
      pairs << nlohmann::json{{"prompt", "Question " + std::to_string(k) + ":"},
                              {"chosen", " yes" + long_answer},
                              {"rejected", " no" + long_answer}}.dump() << "\n";
    }
  }
  const auto prepared = run_command(kCli + " data prepare --input " + dir + "/pairs.jsonl --out-dir " + dir +
                                    "/pairs --val-fraction 0 --tokenizer " + dir + "/model");
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  for (const std::string lora : {"", " --lora-rank 8"}) {
    SCOPED_TRACE(lora.empty() ? "full" : "lora");
    const std::string flags = "--seq-len 32 --batch-size 2 --init-from " + dir + "/model --objective dpo --data " +
                              dir + "/pairs/train.bin" + lora;
    const auto predicted = plan_json("--world-size 1 " + flags);
    const auto measured = train_metrics(lora.empty() ? "dpo_full" : "dpo_lora", flags);
    const double predicted_mib = predicted["tensor_peak_bytes"].get<double>() / kMiB;
    const double measured_mib = measured["allocated_peak_mb"].get<double>();
    EXPECT_NEAR(predicted_mib / measured_mib, 1.0, 0.10)
        << "predicted " << predicted_mib << " MiB (" << predicted["peak_phase"] << "), measured " << measured_mib;
    const auto& parts = predicted["parts"];
    const double reference = parts.contains("the DPO reference's shards") ? parts["the DPO reference's shards"].get<double>() : 0;
    // The reference is the whole model in fp32 (its parameters as the run
    // counted them, on its start line), none under LoRA.
    int64_t params = 0;
    const auto run = (std::filesystem::temp_directory_path() / ("fsdp_plan_test_" + std::string(lora.empty() ? "dpo_full" : "dpo_lora")) / "run/metrics.jsonl").string();
    for (const auto& line : read_metrics(run)) {
      if (line.value("event", "") == "start") params = line["params"].get<int64_t>();
    }
    EXPECT_EQ(std::llround(reference), lora.empty() ? 4 * params : 0);
  }
}

// --accumulate sharded reduce-scatters every micro-step into the shards
// (FSDP2's default) instead of keeping each unit's whole gradient until the
// last: the same training (fp32 sums in another order), a lower peak, and
// the plan's difference between the two is the run's.
TEST(PlanAgainstAccounting, ShardedAccumulationTrainsTheSameAndHoldsShardsNotWholeGradients) {
  const std::string flags = "--model llama-tiny --seq-len 64 --batch-size 4 --grad-accum 3 --world-size 2";
  std::map<std::string, std::vector<double>> losses;
  std::map<std::string, double> measured, predicted;
  for (const std::string mode : {"unsharded", "sharded"}) {
    const std::string dir = temp_dir("accumulate_" + mode);
    const auto r = run_command(kCli + " launch -n 2 -- " + kCli + " train --model llama-tiny --seq-len 64 " +
                               "--batch-size 4 --grad-accum 3 --accumulate " + mode +
                               " --steps 3 --log-every 1 --tensorboard=false --out-dir " + dir + "/run");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const auto& line : read_metrics(dir + "/run/metrics.jsonl")) {
      if (line.contains("loss") && !line.contains("event") && line.value("split", "train") == "train") {
        losses[mode].push_back(line["loss"].get<double>());
      }
      if (line.contains("allocated_peak_mb")) measured[mode] = line["allocated_peak_mb"].get<double>();
    }
    predicted[mode] = plan_json("--model llama-tiny --seq-len 64 --batch-size 4 --grad-accum 3 --world-size 2 "
                                "--accumulate " + mode)["tensor_peak_bytes"].get<double>() / kMiB;
  }
  ASSERT_EQ(losses["sharded"].size(), 3u);
  ASSERT_EQ(losses["unsharded"].size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_NEAR(losses["sharded"][k] / losses["unsharded"][k], 1.0, 1e-5) << "step " << k + 1;
  }
  const double saved = measured["unsharded"] - measured["sharded"];
  EXPECT_GT(saved, 0) << "sharded " << measured["sharded"] << " MiB, unsharded " << measured["unsharded"] << " MiB";
  EXPECT_NEAR(predicted["unsharded"] - predicted["sharded"], saved, 0.2 * saved)
      << "the plan's difference against the run's; " << flags;
}

// The recorded snapshot replays (tools/memory_peak.py, independent of the
// writer) to the same peak the trainer's accounting reports.
// --reshard-after-forward 2 at W = 4: each block keeps half of its gathered
// parameters from its forward until its backward gathers them again. At
// this job's peak (the loss's backward) every block's part is held: the
// run's peak grows by what the plan's part says (measured: 20.31 MiB both),
// and the plan still predicts the run's peak.
TEST(PlanAgainstAccounting, PartsKeptOverFewerRanksAreWhatTheRunAdds) {
  const std::string flags = "--model gpt2-d6 --seq-len 256 --batch-size 2";
  const std::string kept = " --reshard-after-forward 2";
  const auto plan_kept = plan_json("--world-size 4 " + flags + kept);
  const auto freed = train_metrics("freed_after_forward", flags, 4);
  const auto run_kept = train_metrics("kept_over_2", flags + kept, 4);
  EXPECT_EQ(plan_kept["peak_phase"], "loss backward");
  const double part = plan_kept["parts"]["parameters kept over 2 ranks"].get<double>() / kMiB;
  EXPECT_GT(part, 10.0);
  const double grown = run_kept["allocated_peak_mb"].get<double>() - freed["allocated_peak_mb"].get<double>();
  EXPECT_NEAR(grown, part, 0.02 * part);
  EXPECT_NEAR(plan_kept["tensor_peak_bytes"].get<double>() / kMiB / run_kept["allocated_peak_mb"].get<double>(), 1.0,
              0.02);
}

TEST(MemorySnapshot, RecordedPeakEqualsTheAccountingPeak) {
  const std::string dir = temp_dir("snapshot");
  const auto r = run_command("OMP_NUM_THREADS=1 " + kCli +
                             " train --model llama-tiny --seq-len 64 --batch-size 4 --steps 3 --log-every 1 "
                             "--tensorboard=false --memory-snapshot 3 --out-dir " +
                             dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "memory snapshot of steps 1 to 3: " + dir + "/run/memory/rank0.pickle")) << r.output;
  const auto replay =
      run_command(std::string("python3 ") + kSourceDir + "/tools/memory_peak.py --json " + dir +
                  "/run/memory/rank0.pickle");
  ASSERT_EQ(replay.exit_code, 0) << replay.output;
  const auto peak = nlohmann::json::parse(replay.output);
  const auto metrics = read_metrics(dir + "/run/metrics.jsonl").back();
  const double accounting = metrics["allocated_peak_mb"].get<double>() * kMiB;
  EXPECT_EQ(peak["peak_bytes"].get<double>(), accounting);
  EXPECT_EQ(peak["recorded_peak_bytes"].get<double>(), accounting);
  // Every unit's phases were recorded.
  for (const char* phase : {"forward model.layers.0", "backward model.layers.1", "optimizer", "loss"}) {
    bool seen = false;
    for (const auto& [name, bytes] : peak["by_phase"].items()) seen = seen || name == phase;
    const auto all = run_command(
        "python3 -c \"import pickle,sys; s=pickle.load(open(sys.argv[1],'rb')); "
        "print(sorted({e['frames'][0]['name'] for e in s['device_traces'][0]}))\" " +
        dir + "/run/memory/rank0.pickle");
    EXPECT_TRUE(contains(all.output, std::string("'") + phase + "'")) << phase << ": " << all.output;
  }
}

// The chosen configuration, run, stays within the budget (tensors only:
// no headroom, no overhead), where the asked one would not.
TEST(PlanBudget, TheChosenConfigurationFitsWhenRun) {
  const std::string job = "--model gpt2-tiny --seq-len 64 --batch-size 16";
  const auto asked = plan_json(job);
  const auto smaller = plan_json(job + " --activation-checkpoint --chunk-loss --batch-size 2 --grad-accum 8");
  const auto budget =
      static_cast<int64_t>((asked["tensor_peak_bytes"].get<double>() + smaller["tensor_peak_bytes"].get<double>()) / 2);
  const auto r = run_command(kCli + " plan " + job + " --headroom 0 --overhead 0 --budget " + std::to_string(budget));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "this configuration does not fit")) << r.output;
  const auto at = r.output.find("fsdp train --model gpt2-tiny ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string chosen = r.output.substr(at + 11, r.output.find('\n', at) - at - 11);
  EXPECT_TRUE(contains(r.output, "over the budget by") || contains(r.output, "recomputes")) << r.output;
  const auto measured = train_metrics("budget", chosen);
  EXPECT_LE(measured["allocated_peak_mb"].get<double>() * kMiB, static_cast<double>(budget)) << chosen;
}

TEST(PlanErrors, AnImpossibleBudgetNamesWhatTheSmallestNeeds) {
  const auto r = run_command(kCli + " plan --model gpt2-tiny --budget 100KB");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "no configuration fits")) << r.output;
  EXPECT_TRUE(contains(r.output, "the smallest (")) << r.output;
  EXPECT_TRUE(contains(r.output, "needs")) << r.output;
}

TEST(PlanErrors, AnUnknownDeviceListsTheKnownOnes) {
  const auto r = run_command(kCli + " plan --model gpt2-tiny --device h1000");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--device 'h1000' is not known")) << r.output;
  EXPECT_TRUE(contains(r.output, "known devices: h100, ")) << r.output;
}

// `fsdp ARGS` fails with `exit_code` (0: any failure), saying `message`.
void expect_refused(const std::string& args, const std::string& message, int exit_code) {
  const auto r = run_command(kCli + " " + args);
  if (exit_code == 0) {
    EXPECT_NE(r.exit_code, 0) << args << ": " << r.output;
  } else {
    EXPECT_EQ(r.exit_code, exit_code) << args << ": " << r.output;
  }
  EXPECT_TRUE(contains(r.output, message)) << args << ": " << r.output;
}

TEST(PlanErrors, ModelsWithoutFormulasAndBadSizesAreRefusedByName) {
  expect_refused("plan --model example", "no memory formula for the example family", 1);
  expect_refused("plan --model gpt2-tiny --budget lots", "--budget", 0);
  expect_refused("plan --model gpt2-tiny --sharding hybrid_shard --fsdp-size 3 --world-size 4",
                 "does not divide 4 ranks", 1);
  expect_refused("plan --model gpt2-tiny --seq-len 65", "data.seq_len 65 exceeds the model's 64 positions", 1);
  expect_refused("train --model gpt2-tiny --memory-snapshot -1 --steps 1", "logging.memory_snapshot is -1", 0);
}

TEST(PlanDevice, AGpuPlanUsesItsMemoryAsTheBudget) {
  const auto r = run_command(kCli +
                             " plan --model llama3-8b --world-size 8 --batch-size 1 --seq-len 4096 "
                             "--precision bf16 --activation-checkpoint --device h100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "NVIDIA H100 SXM 80GB")) << r.output;
  EXPECT_TRUE(contains(r.output, "flash attention")) << r.output;
  EXPECT_TRUE(contains(r.output, "budget 79.20 GiB")) << r.output;
}

}  // namespace
}  // namespace fsdp::testing::plan_test
