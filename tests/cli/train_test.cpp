// `fsdp train` run as a user runs it: a short run whose loss falls, the
// same losses at W=1 and W=2 on the same global batch, and every bad input
// giving one clear message, a non-zero exit and no files written.

#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_paths.h"
#include "fsdp/data/token_file.h"
#include "fsdp/io/safetensors.h"
#include "run_command.h"
#include "train_support.h"

namespace fsdp::testing::train_test {
namespace {

const std::string kCli = kCliProgram;

TEST(Train, ThirtyStepsOnASmallCorpusLowerTheLoss) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  const auto r = run_command(kCli + " launch -n 2 -- " + kCli + " train --model gpt2-tiny --data " + corpus +
                             " --val-data " + corpus + " --steps 30 --seq-len 32 --batch-size 4 --lr 3e-3" +
                             " --warmup-steps 5 --log-every 1 --eval-every 15 --metrics " + dir + "/m.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto metrics = read_metrics(dir + "/m.jsonl");
  const auto losses = train_losses(metrics);
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_GT(losses.front(), 5.5) << "starts near ln(512) = 6.2";
  EXPECT_LT(losses.back(), losses.front() - 1.5) << "the loss must fall";
  std::vector<double> val;
  for (const auto& m : metrics) {
    if (m.value("split", "") == "val") val.push_back(m["loss"].get<double>());
  }
  ASSERT_EQ(val.size(), 3u) << "at steps 0, 15 and 30";
  EXPECT_LT(val.back(), val.front() - 1.0);
  // Telemetry fields on every training log line.
  for (const auto& m : metrics) {
    if (m.contains("split") || m.contains("event")) continue;
    for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "step_time_s", "comm_wait_s",
                            "data_s", "forward_backward_s", "optimizer_s", "peak_rss_mb", "tokens_seen",
                            "fsdp_collectives", "fsdp_comm_mb"}) {
      EXPECT_TRUE(m.contains(key)) << key << " missing in " << m.dump();
    }
    // From FSDP's event log. gpt2-tiny has 2 blocks and the root as units;
    // FULL_SHARD gathers all 3 in forward, the 2 blocks again in backward
    // (the root stays gathered through backward) and reduce-scatters all 3.
    const int blocks = 2;
    EXPECT_EQ(m["fsdp_collectives"].get<int>(), (blocks + 1) + blocks + (blocks + 1)) << m.dump();
    EXPECT_GT(m["fsdp_comm_mb"].get<double>(), 0);
    EXPECT_GT(m["mfu"].get<double>(), 0);
    EXPECT_LE(m["mfu"].get<double>(), 1.0) << "MFU above 1: the peak was not a peak";
  }
  EXPECT_EQ(metrics.front().value("event", ""), "start");
  EXPECT_GT(metrics.front()["peak_flops_per_rank"].get<double>(), 0);
}

// --epochs 2 over a corpus of R rows of 32 tokens at 2 ranks x 4 rows a
// step makes ceil(2R / 8) steps; beside --steps it is refused.
TEST(Train, EpochsSetTheStepsFromTheRowsTheDataHolds) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  const int64_t rows = (data::TokenFile(corpus).size() - 1) / 32;
  const auto r = run_command(kCli + " launch -n 2 -- " + kCli + " train --model gpt2-tiny --data " + corpus +
                             " --epochs 2 --seq-len 32 --batch-size 4 --log-every 1 --metrics " + dir + "/m.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const int64_t steps = (2 * rows + 7) / 8;
  EXPECT_EQ(train_losses(read_metrics(dir + "/m.jsonl")).size(), static_cast<size_t>(steps)) << rows << " rows";
  EXPECT_NE(r.output.find("in " + std::to_string(steps) + " steps of 8 rows (the data holds " + std::to_string(rows) +
                          ") (--epochs)"),
            std::string::npos)
      << r.output;
  const auto both = run_command(kCli + " train --model gpt2-tiny --data " + corpus + " --epochs 2 --steps 7");
  EXPECT_EQ(both.exit_code, 1) << both.output;
  EXPECT_NE(both.output.find("give one (--epochs sets the steps)"), std::string::npos) << both.output;
}

TEST(Train, TwoRanksReproduceOneRankOnTheSameGlobalBatch) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  const std::string common = " train --model gpt2-tiny --data " + corpus +
                             " --steps 6 --seq-len 16 --lr 1e-3 --log-every 1 --grad-clip 0";
  const auto one = run_command(kCli + " launch -n 1 -- " + kCli + common + " --batch-size 4 --metrics " + dir + "/w1.jsonl");
  const auto two = run_command(kCli + " launch -n 2 -- " + kCli + common + " --batch-size 2 --metrics " + dir + "/w2.jsonl");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const auto a = train_losses(read_metrics(dir + "/w1.jsonl"));
  const auto b = train_losses(read_metrics(dir + "/w2.jsonl"));
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * a[i]) << "step " << i + 1;
}

TEST(Train, ActivationCheckpointingAndChunkedLossUnderFsdpKeepTheLosses) {
  // Dropout on: recomputation inside FSDP units must replay the same masks.
  const auto dir = make_temp_dir();
  for (const std::string model : {"gpt2-tiny", "llama-tiny", "llama4-tiny"}) {
    const std::string common = " train --model " + model + " --steps 4 --seq-len 16 --batch-size 2 --log-every 1" +
                               " --dropout 0.1 --metrics " + dir + "/";
    const auto plain = run_command(kCli + " launch -n 2 -- " + kCli + common + model + "-plain.jsonl");
    const auto ac = run_command(kCli + " launch -n 2 -- " + kCli + common + model +
                                "-ac.jsonl --activation-checkpoint --chunk-loss");
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    ASSERT_EQ(ac.exit_code, 0) << ac.output;
    const auto a = train_losses(read_metrics(dir + "/" + model + "-plain.jsonl"));
    const auto b = train_losses(read_metrics(dir + "/" + model + "-ac.jsonl"));
    ASSERT_EQ(a.size(), 4u);
    ASSERT_EQ(b.size(), 4u);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * a[i]) << model << " step " << i + 1;
    // The premises: dropout is on (without it the losses differ), and the
    // checkpointed, chunked run kept less (its tensor peak is lower).
    const auto off = run_command(kCli + " launch -n 2 -- " + kCli + common + model + "-off.jsonl --dropout 0");
    ASSERT_EQ(off.exit_code, 0) << off.output;
    const auto c = train_losses(read_metrics(dir + "/" + model + "-off.jsonl"));
    ASSERT_EQ(c.size(), 4u);
    // (over all four steps: at step 1 a tiny model's residual stream
    // dwarfs the dropped outputs, and the loss may move by less than 1e-4)
    double moved = 0;
    for (size_t i = 0; i < c.size(); ++i) moved = std::max(moved, std::abs(c[i] - a[i]) / a[i]);
    EXPECT_GT(moved, 1e-4) << model << ": --dropout 0.1 changed nothing";
    // The peaks at sequences of 64: at 16, activations are so small that
    // checkpointing saved 0.3% of llama-tiny's peak, less than the few KB
    // by which a peak moves with when a prefetched gather lands (measured
    // under load: 2.496 to 2.582 MB for the same plain run); at 64 it saves
    // 20 to 35%.
    const auto peak = [&](const std::string& run, const std::string& flags) {
      const std::string metrics = dir + "/" + model + "-" + run + "-64.jsonl";
      const auto r = run_command(kCli + " launch -n 2 -- " + kCli + " train --model " + model +
                                 " --steps 2 --seq-len 64 --batch-size 2 --log-every 1 --metrics " + metrics + flags);
      EXPECT_EQ(r.exit_code, 0) << r.output;
      double most = 0;
      for (const auto& line : read_metrics(metrics)) {
        if (line.contains("allocated_peak_mb")) most = std::max(most, line["allocated_peak_mb"].get<double>());
      }
      return most;
    };
    EXPECT_LT(peak("ac", " --activation-checkpoint --chunk-loss"), peak("plain", ""))
        << model << ": checkpointing and chunking kept as much as the plain run";
  }
}

void expect_clean_failure(const std::string& args, const std::vector<std::string>& needles, const std::string& dir) {
  const std::string metrics = dir + "/never.jsonl";
  const auto r = run_command(kCli + " train " + args + " --metrics " + metrics);
  EXPECT_NE(r.exit_code, 0) << r.output;
  for (const auto& n : needles) EXPECT_NE(r.output.find(n), std::string::npos) << "expected '" << n << "' in\n" << r.output;
  EXPECT_EQ(r.output.find("frame #"), std::string::npos) << r.output;
  EXPECT_FALSE(exists(metrics)) << "nothing may be written on bad input";
}

TEST(Train, PrintModelListsTheUnitsTheWrapPolicyChose) {
  // gpt2-tiny (width 32): an attention holds 32*96+96 + 32*32+32 = 4224
  // parameters, an MLP 32*128+128 + 128*32+32 = 8352; size:5000 makes only
  // the MLPs units. The root keeps embeddings (512*32 + 64*32), the final
  // norm (64) and both attentions and block norms (2 * (4224 + 128)).
  const auto dir = make_temp_dir();
  const auto r = run_command(kCli + " train --model gpt2-tiny --steps 1 --data synthetic --print-model" +
                             " --wrap-policy size:5000 --out-dir " + dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string expected = "FSDP units (--wrap-policy size:5000): 3\n  transformer.h.0.mlp  8352 parameters\n"
                               "  transformer.h.1.mlp  8352 parameters\n  (root)  " +
                               std::to_string(512 * 32 + 64 * 32 + 64 + 2 * (4224 + 128)) + " parameters\n";
  EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
  // It prints and exits, as --print-config does: no step, no run folder.
  EXPECT_EQ(r.output.find("run folder:"), std::string::npos) << r.output;
  EXPECT_FALSE(exists(dir + "/run")) << "--print-model created the run folder";
  const auto bad = run_command(kCli + " train --model gpt2-tiny --steps 1 --data synthetic --wrap-policy size:0");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("'size:0' is not a wrap policy"), std::string::npos) << bad.output;
}

TEST(Train, APlainRunUsesTheThreadsLaunchWouldGiveIt) {
  // Without OMP_NUM_THREADS, a plain run gets every CPU it may use, as
  // `fsdp launch -n 1` gives its one rank (not LibTorch's count of physical
  // cores); `taskset -c 0` leaves one.
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const int cpus = CPU_COUNT(&set);
  const auto dir = make_temp_dir();
  const auto threads_of = [&](const std::string& prefix, const std::string& run) {
    const auto r = run_command("env -u OMP_NUM_THREADS " + prefix + kCli +
                               " train --model gpt2-tiny --data synthetic --steps 1 --out-dir " + dir + "/" + run);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const auto metrics = read_metrics(dir + "/" + run + "/metrics.jsonl");
    for (const auto& m : metrics) {
      if (m.contains("threads_per_rank")) return m["threads_per_rank"].get<int>();
    }
    ADD_FAILURE() << "no threads_per_rank in " << run;
    return 0;
  };
  EXPECT_EQ(threads_of("", "plain"), cpus);
  EXPECT_EQ(threads_of(kCli + " launch -n 1 -- ", "launched"), cpus);
  if (cpus > 1) {
    EXPECT_EQ(threads_of("taskset -c 0 ", "one_cpu"), 1);
  }
}

TEST(TrainErrors, BadConfigFiles) {
  const auto dir = make_temp_dir();
  std::ofstream(dir + "/unknown.yaml") << "optim:\n  learning_rate: 0.1\n";
  expect_clean_failure("--config " + dir + "/unknown.yaml", {"unknown key 'optim.learning_rate'"}, dir);
  std::ofstream(dir + "/type.yaml") << "data:\n  batch_size: eight\n";
  expect_clean_failure("--config " + dir + "/type.yaml", {"data.batch_size is 'eight': expected an integer"}, dir);
  expect_clean_failure("--set optim.lrr=0.1", {"unknown key 'optim.lrr'", "did you mean 'optim.lr'"}, dir);
  expect_clean_failure("--precision fp8", {"runtime.precision is 'fp8'", "fp32, bf16, fp16"}, dir);
}

TEST(TrainErrors, UsageErrorsExitTwoAndBadValuesOne) {
  const auto unknown = run_command(kCli + " train --stepz 3");
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_TRUE(contains(unknown.output, "--stepz")) << unknown.output;
  EXPECT_TRUE(contains(unknown.output, "--steps")) << "the closest flag is suggested\n" << unknown.output;
  EXPECT_EQ(run_command(kCli + " train --steps").exit_code, 2) << "a flag without its value";
  EXPECT_EQ(run_command(kCli).exit_code, 2) << "no subcommand";
  EXPECT_EQ(run_command(kCli + " train --help").exit_code, 0);
  EXPECT_EQ(run_command(kCli + " train --precision fp8").exit_code, 1) << "a bad value, not a usage error";
}

TEST(TrainErrors, BadTokenFiles) {
  const auto dir = make_temp_dir();
  std::ofstream(dir + "/magic.bin") << std::string(2048, 'x');
  expect_clean_failure("--data " + dir + "/magic.bin", {"magic", "expected 20240520"}, dir);
  std::vector<int32_t> tokens(1000, 1);
  data::write_token_file(dir + "/ok.bin", tokens);
  std::ifstream in(dir + "/ok.bin", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::ofstream(dir + "/truncated.bin", std::ios::binary) << bytes.substr(0, bytes.size() - 100);
  expect_clean_failure("--data " + dir + "/truncated.bin", {"truncated"}, dir);
  std::vector<int32_t> big(1000, 600);
  data::write_token_file(dir + "/vocab.bin", big);
  expect_clean_failure("--model gpt2-tiny --data " + dir + "/vocab.bin", {"token id 600", "vocabulary of 512"}, dir);
}

TEST(TrainErrors, SequenceBeyondTheModelsPositions) {
  expect_clean_failure("--model gpt2-tiny --seq-len 100", {"data.seq_len 100 exceeds the model's 64 positions"}, make_temp_dir());
}

// What a run records names what it trained: with --init-from, no preset.
TEST(Train, InitFromRecordsTheDirectoryAndNoPresetAndSaysAModelBesideItIsUnused) {
  const auto dir = make_temp_dir();
  ASSERT_EQ(run_command(kCli + " train --model gpt2-tiny --steps 1 --export-hf " + dir + "/hf --out-dir " + dir +
                        "/first").exit_code, 0);
  const auto r = run_command(kCli + " train --init-from " + dir + "/hf --data synthetic --steps 1 --seq-len 16 "
                             "--out-dir " + dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string yaml = read_file(dir + "/run/config.yaml");
  EXPECT_TRUE(contains(yaml, "  name: \"\"\n")) << yaml;
  EXPECT_TRUE(contains(yaml, "  init_from: \"" + dir + "/hf\"")) << yaml;
  const auto both = run_command(kCli + " train --model llama-tiny --init-from " + dir + "/hf --data synthetic --steps 1 "
                                "--seq-len 16 --out-dir " + dir + "/both");
  EXPECT_EQ(both.exit_code, 0) << both.output;
  EXPECT_TRUE(contains(both.output, "note: --init-from " + dir + "/hf chooses the model; --model llama-tiny is not used"))
      << both.output;
  EXPECT_TRUE(contains(both.output, "(gpt2)")) << "the directory's model was trained\n" << both.output;
  // The recorded configuration is a configuration: it trains again.
  const auto again = run_command(kCli + " train --config " + dir + "/run/config.yaml --steps 1 --out-dir " + dir +
                                 "/again");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  std::filesystem::remove_all(dir);
}

TEST(TrainErrors, InitFromWeightsThatDoNotFitTheirConfig) {
  const auto dir = make_temp_dir();
  const auto ok = run_command(kCli + " train --model gpt2-tiny --steps 1 --export-hf " + dir + "/hf");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  std::ifstream in(dir + "/hf/config.json");
  auto config = nlohmann::json::parse(in);
  config["n_embd"] = 48;
  std::ofstream(dir + "/hf/config.json") << config.dump();
  expect_clean_failure("--init-from " + dir + "/hf", {"has shape [512, 32]", "implies [512, 48]"}, dir);
  expect_clean_failure("--init-from " + dir + "/nothing", {"is not a directory"}, dir);
  // generate --from checks the tensors before it builds the model: 4,096
  // blocks of width 4,096 (terabytes) beside the tiny weights are refused
  // at once, inside an address-space limit that building them would break.
  config["n_embd"] = 4096;
  config["n_layer"] = 4096;
  std::ofstream(dir + "/hf/config.json") << config.dump();
  const auto g = run_command("ulimit -v 8000000; timeout 120 " + kCli + " generate --from " + dir +
                             "/hf --max-new-tokens 1");
  EXPECT_NE(g.exit_code, 0) << g.output;
  EXPECT_NE(g.exit_code, 124) << "still building after 120 s";
  EXPECT_TRUE(contains(g.output, "has shape [512, 32]") && contains(g.output, "implies [512, 4096]")) << g.output;
}

// LoRA: the adapters alone train, so two ranks on the same global batch
// make one rank's losses, and the run says what trains.
TEST(Train, LoraTrainsTheAdaptersAndTwoRanksReproduceOneRank) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  const std::string common = " train --model llama-tiny --data " + corpus +
                             " --steps 4 --seq-len 16 --lr 1e-2 --log-every 1 --grad-clip 0 --lora-rank 4 "
                             "--lora-targets q_proj,v_proj,down_proj --tensorboard=false";
  const auto one = run_command(kCli + " launch -n 1 -- " + kCli + common + " --batch-size 4 --out-dir " + dir + "/w1");
  const auto two = run_command(kCli + " launch -n 2 -- " + kCli + common + " --batch-size 2 --out-dir " + dir + "/w2");
  // With activation checkpointing: the first block's input (the frozen
  // embedding's output) has no gradient, and the adapters inside still must.
  const auto ac = run_command(kCli + common + " --batch-size 4 --activation-checkpoint --out-dir " + dir + "/ac");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  ASSERT_EQ(ac.exit_code, 0) << ac.output;
  // llama-tiny: 2 layers of width 64, so 3 layers x 2 blocks of rank-4 adapters.
  EXPECT_NE(one.output.find("LoRA rank 4, alpha 16 on 6 layers (down_proj,q_proj,v_proj)"), std::string::npos)
      << one.output;
  const auto a = train_losses(read_metrics(dir + "/w1/metrics.jsonl"));
  const auto b = train_losses(read_metrics(dir + "/w2/metrics.jsonl"));
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  const auto c = train_losses(read_metrics(dir + "/ac/metrics.jsonl"));
  ASSERT_EQ(c.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], 1e-5 * a[i]) << "step " << i + 1;
    EXPECT_NEAR(a[i], c[i], 1e-6 * a[i]) << "step " << i + 1 << " with activation checkpointing";
  }
  EXPECT_LT(a.back(), a.front());  // the adapters learn
}

// The run in DIR/run marks step BEST_STEP's checkpoint as its best, and its
// export (DIR/hf) holds that checkpoint's weights, as `fsdp ckpt export`
// of it writes them.
void expect_best_marked_and_exported(const std::string& dir, int64_t best_step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(best_step));
  std::ifstream best_file(dir + "/run/checkpoints/best");
  std::string named;
  std::getline(best_file, named);
  EXPECT_EQ(named, name);
  ASSERT_TRUE(exists(dir + "/run/checkpoints/" + std::string(name)));
  const auto exported = run_command(kCli + " ckpt export " + dir + "/run/checkpoints/" + name + " " + dir + "/best-hf");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  io::SafetensorsFile ours(dir + "/hf/model.safetensors"), reference(dir + "/best-hf/model.safetensors");
  ASSERT_EQ(ours.entries().size(), reference.entries().size());
  for (const auto& e : reference.entries()) {
    ASSERT_NE(ours.find(e.name), nullptr) << e.name;
    EXPECT_TRUE(ours.view(e.name).equal(reference.view(e.name))) << e.name << ": the export is not the best step's";
  }
}

// --keep-best keeps the checkpoint of the lowest validation loss as
// <checkpoint dir>/best through pruning (--keep 1) and exports its weights;
// --patience stops the run after that many evaluations in a row without a
// lower loss. The expected steps are worked out from the run's own val
// losses; the exported weights against `fsdp ckpt export` of that step.
TEST(Train, KeepBestExportsTheLowestValidationLossAndPatienceStopsEarly) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  const auto r = run_command(kCli + " train --model gpt2-tiny --data " + corpus + " --val-data " + corpus +
                             " --steps 60 --seq-len 16 --batch-size 2 --lr 1 --warmup-steps 0 --eval-every 2 "
                             "--eval-batches 2 --keep-best --patience 3 --keep 1 --log-every 1 --tensorboard=false "
                             "--out-dir " + dir + "/run --export-hf " + dir + "/hf");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto metrics = read_metrics(dir + "/run/metrics.jsonl");
  double best = std::numeric_limits<double>::infinity();
  int64_t best_step = 0, since = 0, stop_step = 0, last_train_step = 0;
  nlohmann::json event;
  for (const auto& m : metrics) {
    if (m.value("event", "") == "early_stop") event = m;
    if (!m.contains("loss") || m.contains("event")) continue;
    const int64_t step = m["step"].get<int64_t>();
    if (m.value("split", "train") != "val") {
      last_train_step = step;
      continue;
    }
    if (step == 0 || stop_step > 0) continue;  // step 0's evaluation is where the curve starts, not a candidate
    if (m["loss"].get<double>() < best) {
      best = m["loss"].get<double>();
      best_step = step;
      since = 0;
    } else if (++since == 3) {
      stop_step = step;
    }
  }
  ASSERT_GT(stop_step, 0) << "the validation loss never failed to fall 3 evaluations in a row: nothing to stop\n"
                          << r.output;
  EXPECT_EQ(last_train_step, stop_step);
  ASSERT_FALSE(event.is_null()) << r.output;
  EXPECT_EQ(event["step"], stop_step);
  EXPECT_EQ(event["best_step"], best_step);
  expect_best_marked_and_exported(dir, best_step);
}

// The validation losses a run's metrics recorded, by step.
std::map<int64_t, double> validation_losses(const std::string& metrics) {
  std::map<int64_t, double> out;
  for (const auto& m : read_metrics(metrics)) {
    if (m.contains("loss") && !m.contains("event") && m.value("split", "") == "val") {
      out[m["step"].get<int64_t>()] = m["loss"].get<double>();
    }
  }
  return out;
}

// --eval-batches all scores every row of the validation data once: 5 rows
// of 16 tokens, read 2 a rank at W = 2 (two batches, the last three rows
// past the end counting nothing) and 2 at W = 1 (three batches), equal to
// one rank reading them one a batch in 5 batches, which wraps nowhere.
// The step-0 evaluation scores the initial model, the same in each run.
TEST(Train, EvalBatchesAllScoresEveryValidationRowOnce) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  std::vector<int32_t> val;
  for (int i = 0; i < 5 * 16 + 1; ++i) val.push_back((i * 37 + 11) % 500);
  data::write_token_file(dir + "/val.bin", val);
  const std::string common = " train --model gpt2-tiny --data " + corpus + " --val-data " + dir +
                             "/val.bin --seq-len 16 --steps 1 --eval-every 100 --tensorboard=false";
  const auto run = [&](const std::string& name, int world, const std::string& args) {
    const std::string command = world == 1 ? kCli + common : kCli + " launch -n " + std::to_string(world) + " --" +
                                                                 " " + kCli + common;
    const auto r = run_command(command + " " + args + " --out-dir " + dir + "/" + name);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return validation_losses(dir + "/" + name + "/metrics.jsonl").at(0);
  };
  const double one_a_batch = run("one", 1, "--batch-size 1 --eval-batches 5");
  EXPECT_NEAR(run("all-w2", 2, "--batch-size 2 --eval-batches all"), one_a_batch, 1e-5 * one_a_batch);
  EXPECT_NEAR(run("all-w1", 1, "--batch-size 2 --eval-batches 0"), one_a_batch, 1e-5 * one_a_batch);
  // Three batches of two read a sixth row, the first again: not the same mean.
  EXPECT_GT(std::abs(run("three", 1, "--batch-size 2 --eval-batches 3") - one_a_batch), 1e-4 * one_a_batch);
  const auto bad = run_command(kCli + common + " --eval-batches -1 --out-dir " + dir + "/bad");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_TRUE(contains(bad.output, "eval.batches is -1")) << bad.output;
}

// --eval-every-epoch evaluates after each step that reads the last row of
// an epoch: 10 rows of 16 tokens, 4 a step, so steps 3 (rows 8-11), 5
// (16-19) and 8 (28-31), and no other.
TEST(Train, EvalEveryEpochEvaluatesWhereAnEpochEnds) {
  const auto dir = make_temp_dir();
  std::vector<int32_t> tokens;
  for (int i = 0; i < 10 * 16 + 1; ++i) tokens.push_back((i * 13 + 5) % 500);
  data::write_token_file(dir + "/train.bin", tokens);
  const auto corpus = small_corpus(dir);
  const auto r = run_command(kCli + " train --model gpt2-tiny --data " + dir + "/train.bin --val-data " + corpus +
                             " --seq-len 16 --batch-size 4 --steps 8 --eval-every-epoch --eval-batches 1 "
                             "--tensorboard=false --out-dir " + dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<int64_t> steps;
  for (const auto& [step, loss] : validation_losses(dir + "/run/metrics.jsonl")) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 5, 8})) << r.output;
  const auto synthetic = run_command(kCli + " train --model gpt2-tiny --steps 1 --eval-every-epoch --val-data " +
                                     corpus + " --out-dir " + dir + "/s");
  EXPECT_NE(synthetic.exit_code, 0);
  EXPECT_TRUE(contains(synthetic.output, "synthetic training data has no epochs")) << synthetic.output;
}

// The checkpoint of the step that sets a new best records it, and a run
// resumed from it exports the best: two starts, the first stopping at step
// 2 (where the second evaluation may set the best), the second going on to
// 14 with --patience. Expected from the metrics' validation losses alone.
TEST(Train, ABestSetAtTheLastSavedStepSurvivesTheResume) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  const std::string common = kCli + " train --model gpt2-tiny --data " + corpus + " --val-data " + corpus +
                             " --seq-len 16 --batch-size 2 --lr 1 --warmup-steps 0 --lr-schedule constant "
                             "--eval-every 1 --eval-batches 2 --keep-best --patience 3 --save-every 1 --log-every 1 "
                             "--tensorboard=false --out-dir " + dir + "/run";
  const auto val_losses = [&] {
    std::vector<std::pair<int64_t, double>> out;  // (step, loss) of each evaluation after step 0
    for (const auto& m : read_metrics(dir + "/run/metrics.jsonl")) {
      if (m.contains("loss") && !m.contains("event") && m.value("split", "") == "val" && m["step"].get<int64_t>() > 0) {
        out.emplace_back(m["step"].get<int64_t>(), m["loss"].get<double>());
      }
    }
    return out;
  };
  const auto best_of = [](const std::vector<std::pair<int64_t, double>>& losses) {
    return std::min_element(losses.begin(), losses.end(), [](const auto& a, const auto& b) { return a.second < b.second; })
        ->first;
  };
  const auto first = run_command(common + " --steps 2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto two = val_losses();
  ASSERT_EQ(two.size(), 2u) << first.output;
  std::ifstream meta_file(dir + "/run/checkpoints/step_00000002/metadata.json");
  const auto meta = nlohmann::json::parse(meta_file);
  EXPECT_EQ(meta["extra"]["best_step"].get<int64_t>(), best_of(two)) << meta.dump();

  const auto second = run_command(common + " --steps 14 --export-hf " + dir + "/hf");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const auto all = val_losses();
  int64_t best_step = 0, since = 0, stop = 0;
  double best = std::numeric_limits<double>::infinity();
  for (const auto& [step, loss] : all) {
    if (stop > 0) break;
    if (loss < best) {
      best = loss;
      best_step = step;
      since = 0;
    } else if (++since == 3) {
      stop = step;
    }
  }
  ASSERT_GT(best_step, 0);
  if (stop > 0) {
    bool named_in_event = false;
    for (const auto& m : read_metrics(dir + "/run/metrics.jsonl")) {
      if (m.value("event", "") == "early_stop") named_in_event = m["best_step"].get<int64_t>() == best_step;
    }
    EXPECT_TRUE(named_in_event) << "the early stop names another best than step " << best_step;
  }
  expect_best_marked_and_exported(dir, best_step);
}

TEST(TrainErrors, FineTuningSettingsThatCannotApplyAreRefusedByName) {
  const auto dir0 = make_temp_dir();
  expect_clean_failure("--model gpt2-tiny --steps 1 --keep-best", {"eval.keep_best", "--val-data"}, dir0);
  expect_clean_failure("--model gpt2-tiny --steps 1 --patience 2 --val-data " + small_corpus(dir0),
                       {"eval.patience", "--eval-every"}, dir0);
  const auto dir = make_temp_dir();
  expect_clean_failure("--model llama-tiny --steps 1 --lora-rank 4 --lora-targets q_proj,qproj",
                       {"target 'qproj' names no Linear layer", "q_proj", "all-linear"}, dir);
  expect_clean_failure("--model llama-tiny --steps 1 --merge-lora", {"export.merge_lora", "--lora-rank"}, dir);
  expect_clean_failure("--model llama-tiny --steps 1 --lora-init-from " + dir, {"lora.init_from", "--lora-rank"}, dir);
  expect_clean_failure("--model llama-tiny --steps 1 --lora-rank 4 --lora-init-from " + dir,
                       {"adapter_config.json", dir}, dir);
  expect_clean_failure("--model llama-tiny --steps 1 --lora-rank 4 --lora-dropout 1", {"lora.dropout", "0 <= p < 1"},
                       dir);
  expect_clean_failure("--model gpt2-tiny --steps 1 --lora-rank 4", {"Conv1D", "Llama"}, dir);
  expect_clean_failure("--model llama-tiny --steps 1 --lora-rank 4 --lora-targets q_proj,lm_head",
                       {"'lm_head'", "never train"}, dir);
  // An adapter of another rank.
  std::filesystem::create_directories(dir + "/adapter");
  std::ofstream(dir + "/adapter/adapter_config.json") << R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16})";
  expect_clean_failure("--model llama-tiny --steps 1 --lora-rank 4 --lora-init-from " + dir + "/adapter",
                       {"has rank r = 8", "--lora-rank is 4"}, dir);
}

// An adapter's weights are finite floats: a NaN, or an integer or boolean
// tensor where a weight belongs (each converted silently before), is
// refused naming the tensor, and nothing is written.
TEST(TrainErrors, AnAdapterWithNonFiniteOrNonFloatWeightsIsRefusedByName) {
  const auto dir = make_temp_dir();
  const std::string lora = " --model llama-tiny --lora-rank 4 --lora-targets q_proj --seq-len 16 --batch-size 2";
  const auto made = run_command(kCli + " train" + lora + " --data synthetic --steps 1 --export-hf " + dir + "/adapter");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto good = dir + "/adapter/adapter_model.safetensors";
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  {
    io::SafetensorsFile file(good);
    for (const auto& e : file.entries()) tensors.emplace_back(e.name, file.view(e.name).clone());
  }
  ASSERT_FALSE(tensors.empty());
  const std::string name = tensors.front().first;
  const auto broken = [&](const std::string& label, const torch::Tensor& value, const std::string& needle) {
    const std::string adapter = dir + "/" + label;
    std::filesystem::create_directories(adapter);
    std::filesystem::copy_file(dir + "/adapter/adapter_config.json", adapter + "/adapter_config.json");
    auto changed = tensors;
    changed.front().second = value;
    io::write_safetensors(adapter + "/adapter_model.safetensors", changed);
    expect_clean_failure(lora + " --data synthetic --steps 1 --lora-init-from " + adapter, {"'" + name + "'", needle},
                         dir);
  };
  torch::Tensor nan = tensors.front().second.clone();
  nan.view({-1})[0] = std::numeric_limits<float>::quiet_NaN();
  broken("nan", nan, "holds a NaN or an infinity");
  broken("int", tensors.front().second.to(torch::kInt), "is Int; adapter weights are floating point");
  broken("bool", tensors.front().second.to(torch::kBool), "is Bool; adapter weights are floating point");
  // The adapter as written trains.
  const auto ok = run_command(kCli + " train" + lora + " --data synthetic --steps 1 --lora-init-from " + dir +
                              "/adapter --out-dir " + dir + "/ok");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

TEST(TrainErrors, ColumnsPlacementWithCheckpointsIsRefusedByName) {
  const auto dir = make_temp_dir();
  for (const std::string& with : {"--ckpt-dir " + dir + "/ckpt", std::string("--save-every 1"),
                                 "--out-dir " + dir + "/run --resume"}) {
    expect_clean_failure("--model gpt2-tiny --steps 1 --shard-placement columns " + with,
                         {"fsdp.shard_placement columns cannot be checkpointed", "use rows or flat"}, dir);
  }
  expect_clean_failure("--model gpt2-tiny --steps 1 --shard-placement diagonal",
                       {"'diagonal'", "one of flat, rows, columns"}, dir);
  EXPECT_FALSE(exists(dir + "/ckpt"));
}

TEST(Train, ExportLeavesOutATokenizerLargerThanTheModelsVocabulary) {
  // gpt2-tiny has 512 rows; Llama 3's tokenizer has 128,256 tokens. The
  // export says so and leaves the tokenizer out, instead of writing a
  // directory whose tokenizer the model cannot serve.
  const std::string llama3 = std::string(kSourceDir) + "/data/llama3";
  if (!exists(llama3 + "/tokenizer.json")) GTEST_SKIP() << "data/llama3 is missing (scripts/fetch_data.sh)";
  const auto dir = make_temp_dir();
  const auto r = run_command(kCli + " train --model gpt2-tiny --data synthetic --steps 1 --tokenizer " + llama3 +
                             " --export-hf " + dir + "/hf --out-dir " + dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("has 128256 tokens, more than the model's vocabulary of 512"), std::string::npos) << r.output;
  EXPECT_TRUE(exists(dir + "/hf/config.json"));
  EXPECT_FALSE(exists(dir + "/hf/tokenizer.json"));
  // Nor do that tokenizer's special tokens (128000 and up) become the model's ids.
  std::ifstream in(dir + "/hf/config.json");
  const auto config = nlohmann::json::parse(in);
  EXPECT_TRUE(config["bos_token_id"].is_null()) << config.dump();
  EXPECT_TRUE(config["eos_token_id"].is_null()) << config.dump();
  EXPECT_FALSE(exists(dir + "/hf/generation_config.json"));
}

// GPT-2's tokenizer is the default only for a model of GPT-2's vocabulary:
// for another, `fsdp generate` used to encode with it and print a wrong
// text, exit 0. An explicit tokenizer larger than the model is refused by
// `generate` and by `ckpt export` (before anything is written), naming both
// sizes.
TEST(TrainErrors, AGenerateOrExportTokenizerThatIsNotTheModelsIsRefused) {
  const std::string gpt2 = std::string(kSourceDir) + "/data/gpt2";
  if (!exists(gpt2 + "/encoder.json")) GTEST_SKIP() << "data/gpt2 is missing (scripts/fetch_data.sh)";
  const auto dir = make_temp_dir();
  ASSERT_EQ(run_command(kCli + " train --model gpt2-tiny --vocab-size 60000 --data synthetic --steps 1 --out-dir " +
                        dir + "/run --ckpt-dir " + dir + "/ckpt --tokenizer " + gpt2 + " --export-hf " + dir + "/hf")
                .exit_code,
            0);
  // GPT-2's tokenizer (50,257) fits 60,000 rows: it was exported and serves.
  EXPECT_TRUE(exists(dir + "/hf/vocab.json"));
  EXPECT_EQ(run_command(kCli + " generate --from " + dir + "/hf --max-new-tokens 2").exit_code, 0);
  // Without it, the default is not taken for 60,000 rows.
  for (const char* file : {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"}) {
    std::filesystem::remove(dir + "/hf/" + file);
  }
  const auto fallback = run_command(kCli + " generate --from " + dir + "/hf --max-new-tokens 2");
  EXPECT_EQ(fallback.exit_code, 1) << fallback.output;
  EXPECT_TRUE(contains(fallback.output, "holds no tokenizer, and the default, GPT-2's")) << fallback.output;
  EXPECT_TRUE(contains(fallback.output, "(50257 tokens), is not this model's (60000 tokens)")) << fallback.output;
  // Llama 3's 128,256 tokens cannot serve 60,000 rows.
  const std::string llama3 = std::string(kSourceDir) + "/data/llama3";
  const auto larger = run_command(kCli + " generate --from " + dir + "/hf --tokenizer " + llama3);
  EXPECT_EQ(larger.exit_code, 1) << larger.output;
  EXPECT_TRUE(contains(larger.output, "has 128256 tokens, more than the vocabulary of 60000")) << larger.output;
  const auto exported = run_command(kCli + " ckpt export " + dir + "/ckpt " + dir + "/out --tokenizer " + llama3);
  EXPECT_EQ(exported.exit_code, 1) << exported.output;
  EXPECT_TRUE(contains(exported.output, "has 128256 tokens, more than the vocabulary of 60000")) << exported.output;
  EXPECT_FALSE(exists(dir + "/out"));
}

// Past the model's positions each new token sees only the last ones: said
// once, not left for the user to find in the text.
TEST(Train, GeneratePastTheModelsPositionsSaysSo) {
  const std::string gpt2 = std::string(kSourceDir) + "/data/gpt2";
  if (!exists(gpt2 + "/encoder.json")) GTEST_SKIP() << "data/gpt2 is missing (scripts/fetch_data.sh)";
  const auto dir = make_temp_dir();
  ASSERT_EQ(run_command(kCli + " train --model gpt2-tiny --vocab-size 50257 --data synthetic --steps 1 --out-dir " +
                        dir + "/run --export-hf " + dir + "/hf").exit_code,
            0);
  std::ifstream in(dir + "/hf/config.json");
  const int64_t positions = nlohmann::json::parse(in)["n_positions"].get<int64_t>();
  const auto within = run_command(kCli + " generate --from " + dir + "/hf --ignore-eos --max-new-tokens " +
                                  std::to_string(positions - 8) + " --prompt hello");
  ASSERT_EQ(within.exit_code, 0) << within.output;
  EXPECT_FALSE(contains(within.output, "exceed the model's")) << within.output;
  const auto beyond = run_command(kCli + " generate --from " + dir + "/hf --ignore-eos --max-new-tokens " +
                                  std::to_string(positions + 8) + " --prompt hello");
  ASSERT_EQ(beyond.exit_code, 0) << beyond.output;
  EXPECT_TRUE(contains(beyond.output, "exceed the model's " + std::to_string(positions) +
                                          " positions: beyond them each token sees only the last " +
                                          std::to_string(positions)))
      << beyond.output;
}

// --stop ends the text at the first token after which it holds the string:
// what is printed is a prefix of the full text (sampled with a fixed seed:
// a random model's greedy text repeats one token), holds the string, and
// is shorter.
TEST(Train, GenerateStopsAtAStopString) {
  const std::string gpt2 = std::string(kSourceDir) + "/data/gpt2";
  if (!exists(gpt2 + "/encoder.json")) GTEST_SKIP() << "data/gpt2 is missing (scripts/fetch_data.sh)";
  const auto dir = make_temp_dir();
  ASSERT_EQ(run_command(kCli + " train --model gpt2-tiny --vocab-size 50257 --data synthetic --steps 1 --out-dir " +
                        dir + "/run --export-hf " + dir + "/hf").exit_code,
            0);
  const std::string generate = kCli + " generate --from " + dir + "/hf --temperature 1 --top-k 0 --seed 7 " +
                               "--ignore-eos --max-new-tokens 24 --prompt Hello";
  // stdout alone: the tokenizer line goes to stderr.
  auto text_of = [&](const std::string& extra) {
    const auto r = run_command(generate + extra + " 2>/dev/null >" + dir + "/out.txt");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const std::string out = read_file(dir + "/out.txt");
    return out.substr(0, out.size() - 1);  // its newline
  };
  const std::string full = text_of("");
  const std::string continuation = full.substr(5);
  // Three letters or digits from its middle half (safe on a command line),
  // so that tokens follow them.
  std::string stop;
  for (size_t i = continuation.size() / 4; i + 3 <= continuation.size() * 3 / 4 && stop.empty(); ++i) {
    const auto word = continuation.substr(i, 3);
    if (std::all_of(word.begin(), word.end(), [](unsigned char c) { return std::isalnum(c) != 0; })) stop = word;
  }
  ASSERT_FALSE(stop.empty()) << continuation;
  const std::string text = text_of(" --stop '" + stop + "'");
  EXPECT_EQ(full.compare(0, text.size(), text), 0) << text << " | " << full;
  EXPECT_TRUE(contains(text, stop)) << text;
  EXPECT_LT(text.size(), full.size()) << text;
}

TEST(TrainErrors, NonFiniteWeightsFromInitFromAreNamedWithTheirFile) {
  const auto dir = make_temp_dir();
  ASSERT_EQ(run_command(kCli + " train --model gpt2-tiny --data synthetic --steps 1 --export-hf " + dir + "/hf --out-dir " +
                        dir + "/run").exit_code, 0);
  std::filesystem::copy(dir + "/hf", dir + "/nan");
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::string damaged;
  {
    io::SafetensorsFile file(dir + "/hf/model.safetensors");
    for (const auto& e : file.entries()) tensors.emplace_back(e.name, file.view(e.name).clone());
  }
  for (auto& [name, t] : tensors) {
    if (t.dim() == 2 && damaged.empty()) {
      damaged = name;
      t[0][1] = std::numeric_limits<float>::quiet_NaN();
      t[1][0] = std::numeric_limits<float>::infinity();
    }
  }
  io::write_safetensors(dir + "/nan/model.safetensors", tensors);
  expect_clean_failure("--data synthetic --init-from " + dir + "/nan",
                       {"'" + dir + "/nan/model.safetensors': tensor '" + damaged + "'", "holds 2 non-finite value(s)"},
                       dir);
}

TEST(Train, RunNameBesideOutDirIsNamedAsIgnored) {
  const auto dir = make_temp_dir();
  const auto r = run_command(kCli + " train --model gpt2-tiny --data synthetic --steps 1 --run-name mine --out-dir " +
                             dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: runtime.run_name 'mine' has no effect: runtime.out_dir is set, and the run folder is " +
                          dir + "/run"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(exists("out/mine"));
}

TEST(TrainErrors, UnknownModel) {
  expect_clean_failure("--model gpt3", {"unknown model 'gpt3'", "(a Hugging Face model directory goes to --init-from)"},
                       make_temp_dir());
}

TEST(TrainErrors, AConfigFilesRelativePathMissingHereNamesWhereItWasLookedForAndWhereItIs) {
  const auto dir = make_temp_dir();
  std::filesystem::create_directories(dir + "/project/configs");
  small_corpus(dir + "/project");  // DIR/project/corpus.bin
  std::ofstream(dir + "/project/configs/run.yaml") << "model:\n  name: gpt2-tiny\ndata:\n  train: corpus.bin\n";
  const auto r = run_command("cd " + dir + " && " + kCli + " train --config project/configs/run.yaml --steps 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "--config 'project/configs/run.yaml' sets data.train: 'corpus.bin', which is not in " +
                                     std::filesystem::canonical(dir).string() +
                                     " (paths in a config file are relative to the directory fsdp runs in); it is "
                                     "there relative to " + std::filesystem::canonical(dir).string() + "/project: run from there"))
      << r.output;
  // From the project folder it trains; a flag that overrides the path is not checked against the file.
  EXPECT_EQ(run_command("cd " + dir + "/project && " + kCli + " train --config configs/run.yaml --steps 1 "
                        "--seq-len 16 --batch-size 2").exit_code, 0);
  EXPECT_EQ(run_command("cd " + dir + " && " + kCli + " train --config project/configs/run.yaml --steps 1 "
                        "--seq-len 16 --batch-size 2 --data project/corpus.bin").exit_code, 0);
  std::filesystem::remove_all(dir);
}

TEST(TrainErrors, AHuggingFaceDirectoryOrHubIdAsModelPointsToInitFrom) {
  const auto dir = make_temp_dir();
  std::ofstream(dir + "/config.json") << "{}";
  expect_clean_failure("--model " + dir + " --data synthetic",
                       {"--model '" + dir + "' is a Hugging Face model directory: train from it with --init-from " + dir},
                       dir);
  expect_clean_failure("--model meta-llama/Llama-3.2-1B --data synthetic",
                       {"--model 'meta-llama/Llama-3.2-1B' is no preset nor a directory here; a Hugging Face hub id?",
                        "hf download meta-llama/Llama-3.2-1B --local-dir DIR) and use --init-from DIR"},
                       dir);
}

TEST(Train, PrintConfigShowsTheEffectiveValues) {
  const auto r = run_command(kCli + " train --model llama-tiny --set optim.lr=0.005 --print-config");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("name: \"llama-tiny\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("lr: 0.005"), std::string::npos) << r.output;
}

TEST(Train, NonFiniteStepsAreSkippedOnEveryRankAndStopTheRunWithoutACheckpoint) {
  // A learning rate of 1e30 makes step 1's update blow the weights up to
  // ~1e30: finite, but step 2's activations overflow and its loss is NaN.
  const auto dir = make_temp_dir();
  const auto r = run_command(kCli + " launch -n 2 -- " + kCli +
                             " train --model gpt2-tiny --data synthetic --steps 10 --seq-len 16 --batch-size 2"
                             " --lr 1e30 --warmup-steps 0 --lr-schedule constant --grad-clip 0 --max-bad-steps 2"
                             " --save-every 1 --log-every 1 --ckpt-dir " + dir + "/ckpt --metrics " + dir + "/m.jsonl");
  EXPECT_NE(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(contains(r.output, "[rank " + std::to_string(rank) + "] error: step 3: loss")) << r.output;
  }
  EXPECT_TRUE(contains(r.output, "2 non-finite steps in a row (--max-bad-steps 2)")) << r.output;
  // A NaN's sign bit depends on the kernels that made it (and so on the
  // LibTorch version): either prints.
  EXPECT_TRUE(std::regex_search(r.output, std::regex("step 2: loss -?nan, gradient norm -?nan: not finite, "
                                                     "optimizer step skipped")))
      << r.output;
  std::vector<nlohmann::json> steps;
  for (const auto& m : read_metrics(dir + "/m.jsonl")) {
    if (m.contains("step_time_s")) steps.push_back(m);
  }
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_FALSE(steps[0]["skipped"].get<bool>());
  EXPECT_TRUE(std::isfinite(steps[0]["loss"].get<double>()));
  EXPECT_TRUE(steps[1]["skipped"].get<bool>());
  EXPECT_TRUE(steps[2]["skipped"].get<bool>());
  EXPECT_EQ(steps[2]["skipped_steps"].get<int>(), 2);
  // Only the finite step was saved.
  std::ifstream latest(dir + "/ckpt/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_00000001");
  EXPECT_FALSE(std::filesystem::exists(dir + "/ckpt/step_00000002"));
  // That checkpoint loads, but its weights (~1e30) overflow in every step
  // even at a sane learning rate: all are skipped, and a run that trained
  // nothing does not exit 0.
  const auto again = run_command(kCli + " launch -n 2 -- " + kCli +
                                 " train --model gpt2-tiny --data synthetic --steps 3 --seq-len 16 --batch-size 2"
                                 " --lr 1e-3 --log-every 1 --ckpt-dir " + dir + "/ckpt --out-dir " + dir + "/again");
  EXPECT_NE(again.exit_code, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "resumed from " + dir + "/ckpt/step_00000001")) << again.output;
  EXPECT_TRUE(contains(again.output, "every one of this run's 2 steps was skipped")) << again.output;
}

}  // namespace
}  // namespace fsdp::testing::train_test
