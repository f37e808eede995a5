// What users reach for around `fsdp train`, each end to end through the
// CLI: run folders, TensorBoard files read by an independent decoder,
// profiler traces, token shards and shuffling, resume across a changed
// batch, loss-spike skipping, the torchrun-style launcher, --version and
// --help, and the checks that run before step 1.

#include <sys/stat.h>

#include <cmath>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <gtest/gtest.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include "../test_paths.h"
#include "fsdp/data/token_file.h"
#include "fsdp/train/config.h"
#include "run_command.h"
#include "train_support.h"

namespace fsdp::testing::trainer_tools_test {
namespace {

namespace fs = std::filesystem;
const std::string kCli = kCliProgram;
const std::string kSource = kSourceDir;
const std::string kTiny = " train --model gpt2-tiny --seq-len 16 --batch-size 2 --log-every 1 --lr 1e-3 --grad-clip 0";

std::vector<nlohmann::json> steps_of(const std::vector<nlohmann::json>& metrics) {
  std::vector<nlohmann::json> out;
  for (const auto& m : metrics) {
    if (m.contains("step_time_s")) out.push_back(m);
  }
  return out;
}

// The corpus of small_corpus cut into three shard files train_00{0,1,2}.bin.
std::string sharded_corpus(const std::string& dir) {
  data::TokenFile whole(small_corpus(dir));
  std::vector<int64_t> all(static_cast<size_t>(whole.size()));
  whole.read(0, whole.size(), all.data());
  const std::vector<size_t> cuts = {0, 300, 7000, all.size()};
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    data::write_token_file(dir + "/train_00" + std::to_string(k) + ".bin",
                           std::vector<int32_t>(all.begin() + static_cast<std::ptrdiff_t>(cuts[k]),
                                                all.begin() + static_cast<std::ptrdiff_t>(cuts[k + 1])));
  }
  return dir + "/train_*.bin";
}

TEST(RunFolder, TwoRunsIntoOneFolderDoNotMixAndAResumeContinuesItsOwn) {
  const auto dir = make_temp_dir();
  const auto run = [&](const std::string& folder, const std::string& extra) {
    return run_command(kCli + kTiny + " --data synthetic --out-dir " + dir + "/" + folder + " " + extra);
  };
  ASSERT_EQ(run("run", "--steps 3").exit_code, 0);
  const auto second = run("run", "--steps 2");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_TRUE(contains(second.output, "held an earlier run's files; moved them to " + dir + "/run/earlier-1"))
      << second.output;
  EXPECT_EQ(steps_of(read_metrics(dir + "/run/metrics.jsonl")).size(), 2u) << "only the second run's steps";
  EXPECT_EQ(steps_of(read_metrics(dir + "/run/earlier-1/metrics.jsonl")).size(), 3u) << "the first run's, kept";
  EXPECT_TRUE(exists(dir + "/run/config.yaml"));
  EXPECT_TRUE(contains(read_file(dir + "/run/config.yaml"), "steps: 2"));
  EXPECT_TRUE(contains(read_file(dir + "/run/logs/rank0.log"), "step 2/2"));

  // A run that saves resumes in its own folder and continues its own files.
  ASSERT_EQ(run("saved", "--steps 2 --save-every 2").exit_code, 0);
  const auto resumed = run("saved", "--steps 4");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from " + dir + "/saved/checkpoints/step_00000002")) << resumed.output;
  const auto metrics = read_metrics(dir + "/saved/metrics.jsonl");
  std::vector<std::string> events;
  for (const auto& m : metrics) {
    if (m.contains("event") && m["event"] != "checkpoint") events.push_back(m["event"]);
  }
  EXPECT_EQ(events, (std::vector<std::string>{"start", "resume"}));
  EXPECT_EQ(steps_of(metrics).size(), 4u);
  EXPECT_TRUE(contains(read_file(dir + "/saved/logs/rank0.log"), "--- resumed at step 2 ---"));
  EXPECT_FALSE(exists(dir + "/saved/earlier-1")) << "a resume moves nothing aside";
}

TEST(RunFolder, TensorBoardRecordsDecodeIndependentlyAndCarryTheMetrics) {
  const auto dir = make_temp_dir();
  const auto r = run_command(
      kCli + " launch -n 2 -- " + kCli + kTiny +
      " --data synthetic --val-data synthetic --eval-every 2 --eval-batches 2 --steps 4 --out-dir " + dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> events;
  for (const auto& e : fs::directory_iterator(dir + "/run/tensorboard")) events.push_back(e.path().string());
  ASSERT_EQ(events.size(), 1u) << "rank 0 writes one file";
  EXPECT_TRUE(contains(events[0], "events.out.tfevents."));
  // protoc --decode_raw and python3-crc32c: no code shared with the writer.
  const auto check = run_command("/usr/bin/python3 " + kSource + "/tests/tools/check_tfevents.py " + dir +
                                 "/run/metrics.jsonl " + events[0]);
  ASSERT_EQ(check.exit_code, 0) << check.output;
  EXPECT_TRUE(contains(check.output, "ok: 1 files, 1 file versions")) << check.output;
  // 4 steps with 22 numbers each, and val losses at steps 0, 2, 4.
  EXPECT_TRUE(contains(check.output, "91 scalars match")) << check.output;
}

TEST(RunFolder, ProfileStepsWriteAChromeTracePerRankWithTheFsdpRanges) {
  const auto dir = make_temp_dir();
  const auto r = run_command(kCli + " launch -n 2 -- " + kCli + kTiny +
                             " --data synthetic --steps 4 --profile-steps 2:3 --out-dir " + dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "profiler trace of steps 2:3 written: " + dir + "/run/traces/rank0.json")) << r.output;
  // A window outside the run is named at the start, not silently ignored.
  const auto outside = run_command(kCli + kTiny + " --data synthetic --steps 2 --profile-steps 5:6 --out-dir " + dir + "/late");
  ASSERT_EQ(outside.exit_code, 0) << outside.output;
  EXPECT_TRUE(contains(outside.output, "warning: --profile-steps 5:6 lies outside the steps this run trains (1 to 2)"))
      << outside.output;
  EXPECT_FALSE(exists(dir + "/late/traces/rank0.json"));
  for (int rank = 0; rank < 2; ++rank) {
    const auto path = dir + "/run/traces/rank" + std::to_string(rank) + ".json";
    ASSERT_TRUE(exists(path)) << path;
    const auto trace = nlohmann::json::parse(read_file(path));
    const auto& list = trace.is_array() ? trace : trace.at("traceEvents");
    std::map<std::string, int> ranges;
    std::set<std::string> process_names;
    for (const auto& e : list) {
      const std::string name = e.value("name", "");
      if (name.rfind("FSDP::", 0) == 0) ++ranges[name];
      if (name == "process_name" && e.value("ph", "") == "M") process_names.insert(e["args"].value("name", ""));
    }
    // Traces of several ranks opened together say which rank is which.
    EXPECT_EQ(process_names, std::set<std::string>{"rank " + std::to_string(rank)}) << path;
    // gpt2-tiny: 3 units; per step 5 all-gathers (3 forward, 2 backward), 3
    // reduce-scatters; two steps profiled.
    EXPECT_EQ(ranges["FSDP::all_gather"], 10) << path;
    EXPECT_EQ(ranges["FSDP::reduce_scatter"], 6) << path;
    EXPECT_EQ(ranges["FSDP::pre_forward"], 6) << path;
    EXPECT_EQ(ranges["FSDP::post_forward"], 6) << path;
    EXPECT_EQ(ranges["FSDP::pre_backward"], 6) << path;
    EXPECT_EQ(ranges["FSDP::post_backward"], 6) << path;
  }
}

TEST(Data, ThreeShardsAtOneRankEqualTwoRanksShuffledOrNot) {
  const auto dir = make_temp_dir();
  const auto shards = sharded_corpus(dir);
  const std::string common =
      " train --model gpt2-tiny --seq-len 16 --steps 6 --lr 1e-3 --log-every 1 --grad-clip 0 --data '" + shards + "'";
  std::map<std::string, std::vector<double>> losses;
  for (const std::string shuffle : {"", " --shuffle"}) {
    for (int w : {1, 2}) {
      const auto out = dir + "/w" + std::to_string(w) + (shuffle.empty() ? "" : "s");
      const auto r = run_command(kCli + " launch -n " + std::to_string(w) + " -- " + kCli + common + shuffle +
                                 " --batch-size " + std::to_string(4 / w) + " --out-dir " + out);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      losses[out] = train_losses(read_metrics(out + "/metrics.jsonl"));
      ASSERT_EQ(losses[out].size(), 6u);
    }
  }
  for (const std::string s : {"", "s"}) {
    const auto& a = losses[dir + "/w1" + s];
    const auto& b = losses[dir + "/w2" + s];
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * a[i]) << "step " << i + 1 << " " << s;
  }
  EXPECT_NE(losses[dir + "/w1"], losses[dir + "/w1s"]) << "shuffling changes what is read";
}

TEST(Data, ResumeAfterAShardBoundaryIsBitExactAndAChangedBatchContinuesTheStream) {
  const auto dir = make_temp_dir();
  const auto shards = sharded_corpus(dir);  // the first boundary is at token 300: step 3 crosses it
  const std::string common = kCli + " launch -n 2 -- " + kCli + kTiny + " --shuffle --data '" + shards + "'";
  ASSERT_EQ(run_command(common + " --steps 8 --out-dir " + dir + "/whole").exit_code, 0);
  ASSERT_EQ(run_command(common + " --steps 4 --save-every 4 --out-dir " + dir + "/split").exit_code, 0);
  const auto resumed = run_command(common + " --steps 8 --out-dir " + dir + "/split");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto whole = train_losses(read_metrics(dir + "/whole/metrics.jsonl"));
  const auto split = train_losses(read_metrics(dir + "/split/metrics.jsonl"));
  ASSERT_EQ(whole.size(), 8u);
  ASSERT_EQ(split.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(whole[i], split[i]) << "step " << i + 1;

  // Resuming at batch 1 reads the sequences after those trained on: the
  // same tokens a batch-2 run would, in halves, and says what changed.
  ASSERT_EQ(run_command(common + " --steps 4 --save-every 4 --out-dir " + dir + "/half").exit_code, 0);
  const auto half = run_command(kCli + " launch -n 2 -- " + kCli + kTiny + " --shuffle --data '" + shards +
                                "' --steps 5 --batch-size 1 --out-dir " + dir + "/half");
  ASSERT_EQ(half.exit_code, 0) << half.output;
  EXPECT_TRUE(contains(half.output, "differs from the checkpoint's")) << half.output;
  EXPECT_TRUE(contains(half.output, "data.batch_size: 2 -> 1")) << half.output;
  const auto metrics = steps_of(read_metrics(dir + "/half/metrics.jsonl"));
  ASSERT_EQ(metrics.size(), 5u);
  EXPECT_EQ(metrics[4]["tokens_seen"].get<int64_t>(), 4 * 2 * 2 * 16 + 2 * 1 * 16);
}

TEST(Train, SkipSpikesSkipsTheUpdateOfALossSpike) {
  const auto dir = make_temp_dir();
  // 40 steps of one repeated 16-token phrase (learned to a loss near 0.01),
  // then noise (a loss near 11).
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40 * 64; ++i) tokens.push_back((i % 16) * 13 % 500);
  uint32_t x = 7;
  for (int i = 0; i < 8 * 64 + 1; ++i) {
    x = x * 1103515245u + 12345u;
    tokens.push_back(static_cast<int32_t>((x >> 8) % 500));
  }
  data::write_token_file(dir + "/spiky.bin", tokens);
  const std::string common = kCli +
                             " train --model gpt2-tiny --seq-len 16 --batch-size 4 --lr 1e-2 --warmup-steps 2"
                             " --lr-schedule constant --log-every 1 --steps 42 --data " +
                             dir + "/spiky.bin --max-bad-steps 1";
  const auto plain = run_command(common + " --out-dir " + dir + "/plain");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto guarded = run_command(common + " --skip-spikes 4 --out-dir " + dir + "/guarded");
  ASSERT_EQ(guarded.exit_code, 0) << guarded.output << " (spikes do not count as bad steps)";
  EXPECT_TRUE(contains(guarded.output, "step 41: loss")) << guarded.output;
  EXPECT_TRUE(contains(guarded.output, "loss spike (z-score")) << guarded.output;
  const auto p = steps_of(read_metrics(dir + "/plain/metrics.jsonl"));
  const auto g = steps_of(read_metrics(dir + "/guarded/metrics.jsonl"));
  ASSERT_EQ(g.size(), 42u);
  ASSERT_EQ(p.size(), 42u);
  for (size_t i = 0; i < 40; ++i) {
    EXPECT_FALSE(g[i]["skipped"].get<bool>()) << "step " << i + 1;
    EXPECT_EQ(g[i]["loss"].get<double>(), p[i]["loss"].get<double>()) << "identical until the spike";
  }
  EXPECT_TRUE(g[40]["skipped"].get<bool>());
  EXPECT_GT(g[40]["loss"].get<double>(), g[39]["loss"].get<double>() + 5.0);
  EXPECT_FALSE(p[40]["skipped"].get<bool>()) << "without --skip-spikes the update is taken";
  EXPECT_NE(g[41]["loss"].get<double>(), p[41]["loss"].get<double>()) << "so the next step differs";
}

TEST(Train, ResumingAFinishedRunSaysThereIsNothingLeftToTrain) {
  const auto dir = make_temp_dir();
  const auto cmd = kCli + kTiny + " --data synthetic --steps 2 --save-every 2 --out-dir " + dir + "/run";
  ASSERT_EQ(run_command(cmd).exit_code, 0);
  const auto again = run_command(cmd);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "nothing left to train")) << again.output;
  EXPECT_FALSE(contains(again.output, "step 2/2")) << again.output;
}

TEST(Cli, TorchrunSpellingsLaunch) {
  const auto dir = make_temp_dir();
  const auto r = run_command(kCli + " launch --nproc_per_node=2 --standalone -- " + kCli + kTiny +
                             " --data synthetic --steps 1 --out-dir " + dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_metrics(dir + "/run/metrics.jsonl").front()["world_size"].get<int>(), 2) << r.output;
  const auto one = run_command(kCli + " launch -- /bin/sh -c 'echo world=$WORLD_SIZE'");
  EXPECT_EQ(one.exit_code, 0) << one.output;
  EXPECT_TRUE(contains(one.output, "world=1")) << "-n defaults to 1: " << one.output;
  const auto nodes = run_command(kCli + " launch --nnodes 2 --nproc-per-node 1 -- /bin/true");
  EXPECT_EQ(nodes.exit_code, 2) << nodes.output;
  EXPECT_TRUE(contains(nodes.output, "--node-rank")) << nodes.output;
}

TEST(Cli, VersionNamesWhatABugReportNeeds) {
  const auto r = run_command(kCli + " --version");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The LibTorch this test was compiled against, from its own header.
  for (const std::string& needle : {std::string("fsdp.cpp 0."), std::string("LibTorch ") + TORCH_VERSION + "\n",
                                   std::string("backends: gloo"), std::string("BLAS: "), std::string("CUDA: ")}) {
    EXPECT_TRUE(contains(r.output, needle)) << needle << " in " << r.output;
  }
  EXPECT_FALSE(contains(r.output, "BLAS: none found")) << r.output;
#ifdef FSDP_WITH_CUDA
  EXPECT_TRUE(contains(r.output, "CUDA: built with CUDA ")) << r.output;
  EXPECT_TRUE(contains(r.output, " and NCCL 2.")) << r.output;
#else
  EXPECT_TRUE(contains(r.output, "CUDA: not in this build")) << r.output;
#endif
}

// [Note: MKL's vendor check]: in fsdp.cpp's programs MKL chooses its
// kernels by the CPU's features; with FSDP_MKL_VENDOR_CHECK=1 its own
// vendor check decides, which leaves it on its generic kernels on a CPU
// whose vendor (the kernel's /proc/cpuinfo) is not Intel. `fsdp --version`
// reports, from MKL and the dynamic linker, the branch MKL chose and whose
// answer it got: the program's on any CPU.
TEST(Cli, MklChoosesItsKernelsByTheCpusFeatures) {
  const auto bad = run_command("FSDP_MKL_VENDOR_CHECK=yes " + kCli + " --version");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "FSDP_MKL_VENDOR_CHECK is 'yes': expected 0")) << bad.output;
  const auto ours = run_command("FSDP_MKL_VENDOR_CHECK=0 " + kCli + " --version");
  ASSERT_EQ(ours.exit_code, 0) << ours.output;
  if (!contains(ours.output, "MKL kernels: ")) {
    GTEST_SKIP() << "this LibTorch exports no MKL (another BLAS, or MKL's symbols hidden): " << ours.output;
  }
  EXPECT_TRUE(contains(ours.output, ", chosen by the CPU's features; this program answers MKL's vendor check"))
      << ours.output;
  const auto mkls_own = run_command("FSDP_MKL_VENDOR_CHECK=1 " + kCli + " --version");
  ASSERT_EQ(mkls_own.exit_code, 0) << mkls_own.output;
  std::string vendor;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; vendor.empty() && std::getline(cpuinfo, line);) {
    if (line.rfind("vendor_id", 0) == 0) vendor = line.substr(line.find(':') + 2);
  }
  ASSERT_FALSE(vendor.empty()) << "no vendor_id in /proc/cpuinfo";
  EXPECT_EQ(contains(mkls_own.output, ", chosen by the CPU's features"), vendor == "GenuineIntel")
      << vendor << ": " << mkls_own.output;
}

TEST(Cli, TrainHelpShowsEveryKeysFlagWithItsTypeAndDefault) {
  const auto r = run_command(kCli + " train --help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& key : train::TrainConfig::describe()) {
    EXPECT_TRUE(contains(r.output, key.flag + " ")) << key.flag << " (" << key.dotted << ") has no flag";
    EXPECT_TRUE(contains(r.output, "(" + key.dotted + ")")) << key.dotted;
  }
  for (const char* needle :
       {"--lr FLOAT ", "(optim.lr) (default 0.0003)", "(eval.batches) (default 8)",
        "(optim.beta2) (default 0.95)", "(runtime.precision) (default fp32)", "(logging.tensorboard) (default true)",
        "gpt2-tiny (vocabulary 512)"}) {
    EXPECT_TRUE(contains(r.output, needle)) << needle << " in " << r.output;
  }
  const auto off = run_command(kCli + " train --tensorboard=false --eps 1e-6 --min-lr-ratio 0 --print-config");
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_TRUE(contains(off.output, "tensorboard: false")) << off.output;
  EXPECT_TRUE(contains(off.output, "eps: 1e-06")) << off.output;
}

TEST(Cli, PrintModelShowsShapesAndParameterCounts) {
  const auto r = run_command(kCli + kTiny + " --data synthetic --steps 1 --print-model --out-dir " + make_temp_dir());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // gpt2-tiny: vocabulary 512, width 32, 64 positions.
  EXPECT_TRUE(contains(r.output, "transformer.wte.weight  [512, 32]  16384")) << r.output;
  EXPECT_TRUE(contains(r.output, "transformer.h.1.mlp.c_fc.weight  [32, 128]  4096")) << r.output;
  EXPECT_TRUE(contains(r.output, "total  43904 parameters")) << r.output;
}

TEST(GenerateErrors, FromAndTemperatureAreNamed) {
  const auto missing = run_command(kCli + " generate --from /nonexistent/model --tokenizer " + kSource + "/data/gpt2");
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_TRUE(contains(missing.output, "--from '/nonexistent/model': no such directory")) << missing.output;
  const auto encode = run_command("echo hi | " + kCli + " data encode --tokenizer /nonexistent");
  EXPECT_EQ(encode.exit_code, 1) << encode.output;
  EXPECT_TRUE(contains(encode.output, "--tokenizer '/nonexistent' holds neither a tokenizer.json")) << encode.output;
  const auto cold = run_command(kCli + " generate --from /tmp --temperature -1");
  EXPECT_EQ(cold.exit_code, 2) << cold.output;
  EXPECT_TRUE(contains(cold.output, "--temperature")) << cold.output;
}

TEST(TrainErrors, OutputPathsAreCheckedBeforeStepOne) {
  const auto dir = make_temp_dir();
  std::ofstream(dir + "/a-file") << "x";
  for (const std::string flag : {"--ckpt-dir", "--export-hf", "--out-dir"}) {
    const auto r = run_command(kCli + kTiny + " --data synthetic --steps 2 --out-dir " + dir + "/run " + flag + " " +
                               dir + "/a-file");
    EXPECT_EQ(r.exit_code, 1) << flag << ": " << r.output;
    EXPECT_TRUE(contains(r.output, flag + " '" + dir + "/a-file' is a file")) << r.output;
    EXPECT_FALSE(contains(r.output, "step 1/")) << flag << ": nothing trained: " << r.output;
  }
  EXPECT_EQ(read_file(dir + "/a-file"), "x");
}

TEST(TrainErrors, AFailingExportAtTheEndSavesTheTrainedWeightsFirst) {
  // The example transformer has no Hugging Face equivalent: its export fails
  // only after training, and the run must not lose the trained state.
  const auto dir = make_temp_dir();
  const auto r = run_command(kCli + " train --model example --data synthetic --seq-len 16 --batch-size 2 --steps 2"
                                    " --log-every 1 --export-hf " + dir + "/hf --out-dir " + dir + "/run");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "no Hugging Face equivalent")) << r.output;
  EXPECT_TRUE(contains(r.output, "the trained weights were saved to " + dir + "/run/checkpoints")) << r.output;
  EXPECT_EQ(read_file(dir + "/run/checkpoints/latest"), "step_00000002\n");
  EXPECT_TRUE(contains(read_file(dir + "/run/logs/rank0.log"), "error: ")) << "the rank's log keeps the reason";
}

TEST(TrainErrors, EvalEveryWithoutValidationDataWarns) {
  const auto r = run_command(kCli + kTiny + " --data synthetic --steps 1 --eval-every 1 --out-dir " + make_temp_dir());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "warning: --eval-every 1 has no effect without --val-data")) << r.output;
}

TEST(TrainErrors, Fp16OnACpuBuildIsRefusedAtStart) {
  const auto r =
      run_command(kCli + kTiny + " --data synthetic --steps 2 --precision fp16 --out-dir " + make_temp_dir());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "fp16 compute needs CUDA")) << r.output;
  EXPECT_TRUE(contains(r.output, "use bf16")) << r.output;
}

TEST(TrainErrors, ASamplePromptOutsideTheVocabularyIsRefusedBeforeTraining) {
  if (!exists(kSource + "/data/gpt2/encoder.json")) GTEST_SKIP() << "needs data/gpt2 (scripts/fetch_data.sh)";
  const auto r = run_command(kCli + kTiny +
                             " --data synthetic --steps 2 --sample-tokens 4 --sample-prompt 'Hello world'"
                             " --tokenizer " +
                             kSource + "/data/gpt2 --out-dir " + make_temp_dir());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--sample-prompt encodes to token")) << r.output;
  EXPECT_TRUE(contains(r.output, "vocabulary of 512")) << r.output;
  EXPECT_FALSE(contains(r.output, "step 1/")) << r.output;
  const auto missing = run_command(kCli + kTiny +
                                   " --data synthetic --steps 2 --sample-tokens 4 --tokenizer /nonexistent"
                                   " --out-dir " +
                                   make_temp_dir());
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_TRUE(contains(missing.output, "--tokenizer '/nonexistent'")) << missing.output;
}

// A run's sample ends where the model's text ends, as `fsdp generate`
// stops: here every id is an end of text (generation_config.json), so the
// sample is one token long whatever --sample-tokens asks.
TEST(Samples, ATrainingSampleStopsAtTheModelsEndOfText) {
  if (!exists(kSource + "/data/gpt2/encoder.json")) GTEST_SKIP() << "needs data/gpt2 (scripts/fetch_data.sh)";
  const auto dir = make_temp_dir();
  ASSERT_EQ(run_command(kCli + kTiny + " --data synthetic --steps 1 --export-hf " + dir + "/hf --out-dir " + dir +
                        "/first").exit_code, 0);
  std::vector<int> all(512);
  for (int i = 0; i < 512; ++i) all[i] = i;
  std::ofstream(dir + "/hf/generation_config.json") << nlohmann::json{{"eos_token_id", all}}.dump();
  const std::string run = kCli + " train --init-from " + dir + "/hf --data synthetic --seq-len 16 --batch-size 2 "
                          "--steps 1 --sample-tokens 20 --tokenizer " + kSource + "/data/gpt2 --out-dir ";
  const auto r = run_command(run + dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "--- sample (1 tokens) ---")) << r.output;
  // With no end of text the model can produce (GPT-2's is 50256, past
  // these 512 rows), the sample runs to --sample-tokens.
  std::filesystem::remove(dir + "/hf/generation_config.json");
  auto config = nlohmann::json::parse(read_file(dir + "/hf/config.json"));
  config.erase("eos_token_id");
  std::ofstream(dir + "/hf/config.json") << config.dump();
  const auto full = run_command(run + dir + "/run2");
  ASSERT_EQ(full.exit_code, 0) << full.output;
  EXPECT_TRUE(contains(full.output, "--- sample (20 tokens) ---")) << full.output;
  std::filesystem::remove_all(dir);
}

// The formats people have: a .txt of many documents (paragraphs by
// default, or any separator), .jsonl with another field, a glob of files,
// and a summary in the right unit. Token counts are checked against the
// separator token (50256) that starts each document.
TEST(DataPrepare, TxtParagraphsTextFieldGlobsAndSizes) {
  if (!exists(kSource + "/data/gpt2/encoder.json")) GTEST_SKIP() << "needs data/gpt2 (scripts/fetch_data.sh)";
  const auto dir = make_temp_dir();
  const auto tok = " --tokenizer " + kSource + "/data/gpt2 --val-fraction 0";
  auto documents = [](const std::string& path) {
    data::TokenStream stream(data::expand_token_paths(path, "test"));
    std::vector<int64_t> ids(static_cast<size_t>(stream.size()));
    stream.read(0, stream.size(), ids.data());
    return std::count(ids.begin(), ids.end(), 50256);
  };
  // Three paragraphs; the second blank line holds only spaces.
  std::ofstream(dir + "/book.txt") << "First paragraph,\nstill the first.\n\nSecond one.\n   \nThird---one.\n";
  const auto paragraphs = run_command(kCli + " data prepare --input " + dir + "/book.txt --out-dir " + dir + "/p" + tok);
  ASSERT_EQ(paragraphs.exit_code, 0) << paragraphs.output;
  EXPECT_EQ(documents(dir + "/p/train.bin"), 3);
  EXPECT_TRUE(contains(paragraphs.output, "split into documents at blank lines (--doc-separator)")) << paragraphs.output;
  EXPECT_TRUE(contains(paragraphs.output, "3 documents, 56 B of text")) << paragraphs.output;
  const auto whole = run_command(kCli + " data prepare --input " + dir + "/book.txt --doc-separator '' --out-dir " +
                                 dir + "/w" + tok);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  EXPECT_EQ(documents(dir + "/w/train.bin"), 1);
  const auto dashes = run_command(kCli + " data prepare --input " + dir + "/book.txt --doc-separator '---' --out-dir " +
                                  dir + "/d" + tok);
  ASSERT_EQ(dashes.exit_code, 0) << dashes.output;
  EXPECT_EQ(documents(dir + "/d/train.bin"), 2);
  // .jsonl whose text is under "content": named by --text-field, and
  // without it the error lists the string fields there are.
  for (const char* name : {"a.jsonl", "b.jsonl"}) {
    std::ofstream out(dir + "/" + name);
    for (int i = 0; i < 3; ++i) out << nlohmann::json({{"id", i}, {"content", std::string(400, 'x')}}).dump() << "\n";
  }
  const auto unnamed = run_command(kCli + " data prepare --input " + dir + "/a.jsonl --out-dir " + dir + "/u" + tok);
  EXPECT_EQ(unnamed.exit_code, 1) << unnamed.output;
  EXPECT_TRUE(contains(unnamed.output, "line 1 has no string field \"text\" (its string fields: \"content\"; "
                                       "--text-field chooses one)"))
      << unnamed.output;
  EXPECT_FALSE(exists(dir + "/u/train.bin"));
  const auto glob = run_command(kCli + " data prepare --input '" + dir + "/*.jsonl' --text-field content --out-dir " +
                                dir + "/g" + tok);
  ASSERT_EQ(glob.exit_code, 0) << glob.output;
  EXPECT_EQ(documents(dir + "/g/train.bin"), 6);
  EXPECT_TRUE(contains(glob.output, "6 documents, 2.4 KB of text")) << glob.output;
  const auto none = run_command(kCli + " data prepare --input '" + dir + "/*.parquet' --out-dir " + dir + "/n" + tok);
  EXPECT_EQ(none.exit_code, 1) << none.output;
  EXPECT_TRUE(contains(none.output, "matches no .txt, .json, .jsonl, .parquet or .arrow file")) << none.output;
}

// Several --input files are one corpus in the order given: the tokens of
// one file holding both; a file named twice is refused by name. A
// validation set prepared apart (--as-validation) goes to val.bin whole:
// the tokens one split would hold, and no train.bin.
TEST(DataPrepare, SeveralInputsAreOneCorpusAndAValidationSetPreparesAsValidation) {
  if (!exists(kSource + "/data/gpt2/encoder.json")) GTEST_SKIP() << "needs data/gpt2 (scripts/fetch_data.sh)";
  const auto dir = make_temp_dir();
  const auto tok = " --tokenizer " + kSource + "/data/gpt2";
  const auto read_tokens = [](const std::string& path) {
    data::TokenStream stream(data::expand_token_paths(path, "test"));
    std::vector<int64_t> ids(static_cast<size_t>(stream.size()));
    stream.read(0, stream.size(), ids.data());
    return ids;
  };
  std::ofstream(dir + "/a.jsonl") << R"({"text": "The first file's one document."})" << "\n";
  std::ofstream(dir + "/b.jsonl") << R"({"text": "The second file, first document."})" << "\n"
                                  << R"({"text": "And its second."})" << "\n";
  std::ofstream(dir + "/both.jsonl") << R"({"text": "The first file's one document."})" << "\n"
                                     << R"({"text": "The second file, first document."})" << "\n"
                                     << R"({"text": "And its second."})" << "\n";
  const auto two = run_command(kCli + " data prepare --input " + dir + "/a.jsonl --input " + dir +
                               "/b.jsonl --val-fraction 0 --out-dir " + dir + "/two" + tok);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const auto one = run_command(kCli + " data prepare --input " + dir + "/both.jsonl --val-fraction 0 --out-dir " + dir +
                               "/one" + tok);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(read_tokens(dir + "/two/train.bin"), read_tokens(dir + "/one/train.bin"));
  const auto twice = run_command(kCli + " data prepare --input " + dir + "/a.jsonl --input '" + dir +
                                 "/*.jsonl' --out-dir " + dir + "/twice" + tok);
  EXPECT_EQ(twice.exit_code, 1) << twice.output;
  EXPECT_TRUE(contains(twice.output, "names '" + dir + "/a.jsonl', which an earlier --input named")) << twice.output;
  EXPECT_FALSE(exists(dir + "/twice/train.bin"));

  const auto val = run_command(kCli + " data prepare --input " + dir + "/both.jsonl --as-validation --out-dir " + dir +
                               "/val" + tok);
  ASSERT_EQ(val.exit_code, 0) << val.output;
  EXPECT_FALSE(exists(dir + "/val/train.bin"));
  EXPECT_EQ(read_tokens(dir + "/val/val.bin"), read_tokens(dir + "/one/train.bin"));
  const auto both_ways = run_command(kCli + " data prepare --input " + dir +
                                     "/both.jsonl --as-validation --val-fraction 0.5 --out-dir " + dir + "/bw" + tok);
  EXPECT_NE(both_ways.exit_code, 0) << both_ways.output;
  EXPECT_TRUE(contains(both_ways.output, "--as-validation")) << both_ways.output;
}

// Parquet, the format Hugging Face datasets ship: its text column gives the
// same token file as the same documents as .jsonl (the reader this test
// compares with); rows over several row groups, a null row skipped, a
// missing column and a file that is not Parquet named.
TEST(DataPrepare, ParquetAndASavedDatasetGiveTheTokensOfTheSameDocumentsAsJsonl) {
  if (!exists(kSource + "/data/gpt2/encoder.json")) GTEST_SKIP() << "needs data/gpt2 (scripts/fetch_data.sh)";
  const std::string python = kSource + "/.venv/bin/python";
  if (run_command(python + " -c 'import pyarrow'").exit_code != 0) GTEST_SKIP() << "needs pyarrow (scripts/setup.sh)";
  const auto dir = make_temp_dir();
  const auto made = run_command(
      python + " -c '\nimport json, pyarrow as pa, pyarrow.parquet as pq\n"
      "docs = [\"The first document.\\nTwo lines.\", \"\u00dcn\u00efc\u00f6d\u00e9, \\\"quotes\\\" and a\\ttab\", None] + "
      "[f\"Row {i} of the dataset.\" for i in range(50)]\n"
      "pq.write_table(pa.table({\"id\": list(range(len(docs))), \"body\": docs}), \"" + dir + "/train.parquet\", "
      "row_group_size=7)\n"
      "open(\"" + dir + "/train.jsonl\", \"w\").writelines(json.dumps({\"body\": d}) + \"\\n\" for d in docs if d)\n'");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto tok = " --tokenizer " + kSource + "/data/gpt2 --val-fraction 0 --text-field body";
  const auto parquet = run_command(kCli + " data prepare --input " + dir + "/train.parquet --out-dir " + dir + "/p" + tok);
  ASSERT_EQ(parquet.exit_code, 0) << parquet.output;
  EXPECT_TRUE(contains(parquet.output, "52 documents")) << parquet.output;
  const auto jsonl = run_command(kCli + " data prepare --input " + dir + "/train.jsonl --out-dir " + dir + "/j" + tok);
  ASSERT_EQ(jsonl.exit_code, 0) << jsonl.output;
  EXPECT_EQ(read_file(dir + "/p/train.bin"), read_file(dir + "/j/train.bin"));
  // The same rows as `datasets` saves them to disk (Arrow files beside
  // dataset_info.json and state.json, which are not documents), and the
  // DatasetDict around them refused, naming a split's folder.
  if (run_command(python + " -c 'import datasets'").exit_code == 0) {
    const auto saved = run_command(
        python + " -c '\nimport datasets, pyarrow.parquet as pq\n"
        "ds = datasets.Dataset(pq.read_table(\"" + dir + "/train.parquet\"))\n"
        "ds.save_to_disk(\"" + dir + "/saved\", max_shard_size=400)\n"
        "datasets.DatasetDict({\"train\": ds}).save_to_disk(\"" + dir + "/dict\")\n'");
    ASSERT_EQ(saved.exit_code, 0) << saved.output;
    const auto arrow = run_command(kCli + " data prepare --input " + dir + "/saved --out-dir " + dir + "/a" + tok);
    ASSERT_EQ(arrow.exit_code, 0) << arrow.output;
    EXPECT_EQ(read_file(dir + "/a/train.bin"), read_file(dir + "/j/train.bin"));
    const auto dict = run_command(kCli + " data prepare --input " + dir + "/dict --out-dir " + dir + "/d" + tok);
    EXPECT_EQ(dict.exit_code, 1) << dict.output;
    EXPECT_TRUE(contains(dict.output, "is a datasets DatasetDict folder")) << dict.output;
    EXPECT_TRUE(contains(dict.output, "'" + dir + "/dict/train'")) << dict.output;
  }
  const auto column = run_command(kCli + " data prepare --input " + dir + "/train.parquet --out-dir " + dir +
                                  "/c --tokenizer " + kSource + "/data/gpt2");
  EXPECT_EQ(column.exit_code, 1) << column.output;
  EXPECT_TRUE(contains(column.output, "error: '" + dir + "/train.parquet' has no text column \"text\" (its text "
                                      "columns: body; --text-field chooses one)\n"))
      << column.output;
  EXPECT_FALSE(exists(dir + "/c/train.bin"));
  std::ofstream(dir + "/bad.parquet") << "not parquet";
  const auto bad = run_command(kCli + " data prepare --input " + dir + "/bad.parquet --out-dir " + dir + "/b" + tok);
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_TRUE(contains(bad.output, "'" + dir + "/bad.parquet' is not a Parquet file")) << bad.output;
  std::filesystem::remove_all(dir);
}

// A FIFO named like an input of every kind is refused at once, naming it;
// `data prepare` waited on it for a writer before.
TEST(DataPrepare, AFifoAsAnyKindOfInputIsRefusedWithoutWaiting) {
  if (!exists(kSource + "/data/gpt2/encoder.json")) GTEST_SKIP() << "needs data/gpt2 (scripts/fetch_data.sh)";
  const auto dir = make_temp_dir();
  for (const std::string name : {"docs.jsonl", "docs.txt", "docs.parquet"}) {
    const auto fifo = dir + "/" + name;
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << fifo;
    const auto r = run_command("timeout 30 " + kCli + " data prepare --input " + fifo + " --out-dir " + dir + "/out-" +
                               name + " --tokenizer " + kSource + "/data/gpt2");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << name << ": still waiting after 30 s";
    EXPECT_TRUE(contains(r.output, "'" + fifo + "' is a FIFO")) << r.output;
  }
}

TEST(DataPrepare, JsonlShardsAndNoValidationSplit) {
  if (!exists(kSource + "/data/gpt2/encoder.json")) GTEST_SKIP() << "needs data/gpt2 (scripts/fetch_data.sh)";
  const auto dir = make_temp_dir();
  {
    std::ofstream jsonl(dir + "/docs.jsonl");
    for (int i = 0; i < 40; ++i)
      jsonl << nlohmann::json({{"text", "Document " + std::to_string(i) + " says hello."}}).dump() << "\n";
  }
  const auto tok = " --tokenizer " + kSource + "/data/gpt2";
  const auto r = run_command(kCli + " data prepare --input " + dir + "/docs.jsonl --out-dir " + dir + "/out" + tok +
                             " --shard-tokens 100 --val-fraction 0.1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "40 documents")) << r.output;
  EXPECT_TRUE(contains(r.output, "tokenized 40/40 documents")) << "progress: " << r.output;
  // Each document is <|endoftext|> + 5 tokens ("Document", " N", " says", " hello", ".").
  data::TokenStream train(data::expand_token_paths(dir + "/out/train_*.bin", "test"));
  data::TokenStream val(data::expand_token_paths(dir + "/out/val_*.bin", "test"));
  EXPECT_EQ(train.size() + val.size(), 40 * 6);
  EXPECT_EQ(val.size(), 4 * 6) << "every 10th document";
  EXPECT_EQ(train.files(), static_cast<size_t>((36 * 6 + 99) / 100));
  // One thread gives the same files.
  ASSERT_EQ(run_command(kCli + " data prepare --input " + dir + "/docs.jsonl --out-dir " + dir + "/one" + tok +
                        " --shard-tokens 100 --val-fraction 0.1 --threads 1")
                .exit_code,
            0);
  EXPECT_EQ(read_file(dir + "/one/train_000000.bin"), read_file(dir + "/out/train_000000.bin"));
  // --val-fraction 0: no val file at all; one short document: no empty val.bin.
  ASSERT_EQ(run_command(kCli + " data prepare --input " + dir + "/docs.jsonl --out-dir " + dir + "/noval" + tok +
                        " --val-fraction 0")
                .exit_code,
            0);
  EXPECT_TRUE(exists(dir + "/noval/train.bin"));
  EXPECT_FALSE(exists(dir + "/noval/val.bin"));
  std::ofstream(dir + "/short.txt") << "Hi there";
  const auto tiny = run_command(kCli + " data prepare --input " + dir + "/short.txt --out-dir " + dir + "/tiny" + tok);
  ASSERT_EQ(tiny.exit_code, 0) << tiny.output;
  EXPECT_FALSE(exists(dir + "/tiny/val.bin")) << tiny.output;
  EXPECT_TRUE(contains(tiny.output, "one document: no validation split")) << tiny.output;
  // Fewer documents than one in 20 (the default): the last whole document
  // is held out, with its separator, and the output says so.
  {
    std::ofstream few(dir + "/few.jsonl");
    for (int i = 0; i < 5; ++i) few << nlohmann::json({{"text", "Document " + std::to_string(i) + " says hello."}}).dump() << "\n";
  }
  const auto five = run_command(kCli + " data prepare --input " + dir + "/few.jsonl --out-dir " + dir + "/few" + tok);
  ASSERT_EQ(five.exit_code, 0) << five.output;
  EXPECT_TRUE(contains(five.output, "5 documents, fewer than the 20 one in --val-fraction needs")) << five.output;
  data::TokenStream few_train(data::expand_token_paths(dir + "/few/train.bin", "test"));
  data::TokenStream few_val(data::expand_token_paths(dir + "/few/val.bin", "test"));
  EXPECT_EQ(few_train.size(), 4 * 6);
  ASSERT_EQ(few_val.size(), 6) << "one whole document: <|endoftext|> and its 5 tokens";
  int64_t first = -1;
  few_val.read(0, 1, &first);
  EXPECT_EQ(first, 50256) << "the held-out document starts with the separator";
}

// [Note: a prepared folder is one prepare's]: a second prepare into the
// folder removes the token files of the first it does not write (and says
// so); a shard the record does not list, a record of a prepare that did
// not finish, and a record that is not a regular file are refused by
// train, naming them; a record's text reaches the terminal without
// control characters.
TEST(DataPrepare, AFolderHoldsOnePreparesFilesAndWhatItDoesNotListIsRefused) {
  if (!exists(kSource + "/data/gpt2/encoder.json")) GTEST_SKIP() << "needs data/gpt2 (scripts/fetch_data.sh)";
  const auto dir = make_temp_dir();
  {
    std::ofstream jsonl(dir + "/docs.jsonl");
    for (int i = 0; i < 40; ++i)
      jsonl << nlohmann::json({{"text", "Document " + std::to_string(i) + " says hello."}}).dump() << "\n";
  }
  const auto prepare = kCli + " data prepare --input " + dir + "/docs.jsonl --out-dir " + dir + "/out --tokenizer " +
                       kSource + "/data/gpt2";
  // An empty file: no documents, said so (it asked about empty .jsonl
  // files, whatever the input: a Parquet file of null texts too).
  std::ofstream(dir + "/nulls.jsonl") << "";
  const auto nulls = run_command(kCli + " data prepare --input " + dir + "/nulls.jsonl --out-dir " + dir +
                                 "/nulls --tokenizer " + kSource + "/data/gpt2");
  EXPECT_EQ(nulls.exit_code, 1) << nulls.output;
  EXPECT_TRUE(contains(nulls.output, "holds no documents: its 1 file(s) are empty, or hold only null or empty texts"))
      << nulls.output;
  std::ofstream(dir + "/a-file") << "kept\n";
  const auto onto_file = run_command(kCli + " data prepare --input " + dir + "/docs.jsonl --out-dir " + dir +
                                     "/a-file --tokenizer " + kSource + "/data/gpt2");
  EXPECT_EQ(onto_file.exit_code, 1) << onto_file.output;
  EXPECT_TRUE(contains(onto_file.output, "--out-dir '" + dir + "/a-file' is a file; expected a directory"))
      << onto_file.output;
  EXPECT_EQ(read_file(dir + "/a-file"), "kept\n");
  ASSERT_EQ(run_command(prepare + " --shard-tokens 30 --val-fraction 0.1").exit_code, 0);
  ASSERT_TRUE(exists(dir + "/out/train_000007.bin") && exists(dir + "/out/val_000000.bin"));
  const auto again = run_command(prepare + " --shard-tokens 100 --val-fraction 0");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "removed 6 token files an earlier prepare had left in " + dir + "/out: "
                                     "train_000003.bin, train_000004.bin, train_000005.bin, train_000006.bin, "
                                     "train_000007.bin, val_000000.bin"))
      << again.output;
  data::TokenStream train(data::expand_token_paths(dir + "/out/train_*.bin", "test"));
  EXPECT_EQ(train.files(), 3u);
  EXPECT_EQ(train.size(), 40 * 6) << "the glob takes this prepare's tokens, nothing of the earlier one";
  EXPECT_FALSE(exists(dir + "/out/val_000000.bin"));
  const auto record = nlohmann::json::parse(read_file(dir + "/out/tokenizer_record.json"));
  EXPECT_EQ(record.at("files"), nlohmann::json({"train_000000.bin", "train_000001.bin", "train_000002.bin"}));
  EXPECT_EQ(record.at("complete"), true);

  const auto train_on = [&](const std::string& data) {
    return run_command("timeout 60 " + kCli + kTiny + " --vocab-size 50304 --steps 1 --data '" + data + "' --out-dir " + dir + "/run");
  };
  ASSERT_EQ(train_on(dir + "/out/train_*.bin").exit_code, 0);
  // A shard the record does not list (copied in, or left by a prepare of
  // before the list): refused by name, through a glob too.
  std::filesystem::copy_file(dir + "/out/train_000000.bin", dir + "/out/train_000009.bin");
  const auto stray = train_on(dir + "/out/train_*.bin");
  EXPECT_NE(stray.exit_code, 0) << stray.output;
  EXPECT_TRUE(contains(stray.output, "'" + dir + "/out/train_000009.bin' is not one of the token files '" + dir +
                                         "/out/tokenizer_record.json' lists (3 files)"))
      << stray.output;
  std::filesystem::remove(dir + "/out/train_000009.bin");
  // A prepare stopped midway (its record says so).
  auto stopped = record;
  stopped["complete"] = false;
  std::ofstream(dir + "/out/tokenizer_record.json") << stopped.dump();
  const auto midway = train_on(dir + "/out/train_*.bin");
  EXPECT_NE(midway.exit_code, 0) << midway.output;
  EXPECT_TRUE(contains(midway.output, "did not finish (stopped or failed midway)")) << midway.output;
  // Control characters in a record's text are not printed.
  auto painted = record;
  painted["tokenizer"] = "\x1b[31mred\x1b[0m";
  std::ofstream(dir + "/out/tokenizer_record.json") << painted.dump();
  const auto shown = train_on(dir + "/out/train_000000.bin");
  EXPECT_EQ(shown.exit_code, 0) << shown.output;
  EXPECT_TRUE(contains(shown.output, "tokenized by ?[31mred?[0m")) << shown.output;
  EXPECT_FALSE(contains(shown.output, "\x1b")) << shown.output;
  // A record that is a FIFO: refused at once, not waited on or passed over.
  std::filesystem::remove(dir + "/out/tokenizer_record.json");
  ASSERT_EQ(::mkfifo((dir + "/out/tokenizer_record.json").c_str(), 0600), 0);
  const auto fifo = train_on(dir + "/out/train_000000.bin");
  EXPECT_NE(fifo.exit_code, 0) << fifo.output;
  EXPECT_NE(fifo.exit_code, 124) << "waited on the FIFO";
  EXPECT_TRUE(contains(fifo.output, "/out/tokenizer_record.json' is not a regular file")) << fifo.output;
  // A tokenizer.json that is a FIFO or a directory: refused, not passed
  // over for GPT-2's tokenizer.
  for (const bool folder : {false, true}) {
    const std::string model = dir + (folder ? "/with-folder" : "/with-fifo");
    std::filesystem::create_directories(model);
    if (folder) {
      std::filesystem::create_directory(model + "/tokenizer.json");
    } else {
      ASSERT_EQ(::mkfifo((model + "/tokenizer.json").c_str(), 0600), 0);
    }
    const auto r = run_command("timeout 30 " + kCli + " data encode --tokenizer " + model + " < /dev/null");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "waited on the FIFO";
    EXPECT_TRUE(contains(r.output, "'" + model + "/tokenizer.json' is not a regular file")) << r.output;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fsdp::testing::trainer_tools_test
