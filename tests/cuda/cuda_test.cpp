// The CUDA path, run where a GPU is visible (label `cuda`). Elsewhere each
// test skips, saying why: a CPU build, or a CUDA build with no device.

#include <cmath>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "../cli/run_command.h"
#include "../cli/train_support.h"
#include "../test_paths.h"
#include "fsdp/common/compat.h"
#include "fsdp/core/grad_norm.h"
#include "fsdp/models/registry.h"
#include "fsdp/train/generate.h"

namespace fsdp::testing::cuda_test {
namespace {

const std::string kCli = kCliProgram;

// Why this machine cannot run the GPU path; empty where it can.
std::string no_gpu_reason() {
#ifndef FSDP_WITH_CUDA
  return "this build has no CUDA (a CPU LibTorch); scripts/build_cuda.sh builds one";
#else
  return torch::cuda::is_available() ? "" : "no CUDA device is visible";
#endif
}

// A macro: GTEST_SKIP returns from the function it is written in.
#define SKIP_WITHOUT_A_GPU()                                        \
  do {                                                              \
    if (const auto reason = no_gpu_reason(); !reason.empty()) GTEST_SKIP() << reason; \
  } while (0)

TEST(Cuda, SmokeOnTheGpuConnectsOverNccl) {
  SKIP_WITHOUT_A_GPU();
  const auto r = run_command(kCli + " launch -n 1 -- " + kCli + " smoke --device cuda");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "nccl")) << r.output;
}

// The same steps on the GPU and on the CPU: losses agree to fp32's
// accumulated rounding (different kernels), 1e-4 relative over 4 steps.
TEST(Cuda, TrainingOnTheGpuMatchesTheCpu) {
  SKIP_WITHOUT_A_GPU();
  const auto dir = make_temp_dir();
  std::map<std::string, std::vector<double>> losses;
  for (const std::string device : {"cpu", "cuda"}) {
    const auto r = run_command(kCli + " launch -n 1 -- " + kCli +
                               " train --model gpt2-tiny --data synthetic --steps 4 --seq-len 16 --batch-size 2"
                               " --log-every 1 --device " + device + " --out-dir " + dir + "/" + device);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    losses[device] = train_losses(read_metrics(dir + "/" + device + "/metrics.jsonl"));
  }
  ASSERT_EQ(losses["cpu"].size(), 4u);
  ASSERT_EQ(losses["cuda"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(losses["cuda"][i], losses["cpu"][i], 1e-4 * losses["cpu"][i]) << i;
}

// One W = 1 run over NCCL on the GPU (or the CPU for the reference): the
// losses of its logged steps. ARGS are `fsdp train` arguments.
std::vector<double> train_on(const std::string& device, const std::string& dir, const std::string& args) {
  const auto r = run_command(kCli + " launch -n 1 -- " + kCli + " train --data synthetic --log-every 1 --seq-len 16"
                             " --batch-size 2 --device " + device + " --out-dir " + dir + " " + args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return {};
  return train_losses(read_metrics(dir + "/metrics.jsonl"));
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(want.empty());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], rel * std::abs(want[i])) << "step " << i + 1;
}

// Every family's forward builds its positions or rotary tables on the
// tokens' device, and a mixture of experts counts its tokens on the host:
// each trains on the GPU as on the CPU.
TEST(Cuda, EveryFamilyTrainsOnTheGpuAsOnTheCpu) {
  SKIP_WITHOUT_A_GPU();
  const auto dir = make_temp_dir();
  for (const std::string model : {"llama-tiny", "qwen3-tiny", "qwen3-moe-tiny", "llama4-tiny", "example"}) {
    SCOPED_TRACE(model);
    const auto args = "--model " + model + " --steps 3";
    expect_close(train_on("cuda", dir + "/" + model + "-cuda", args), train_on("cpu", dir + "/" + model + "-cpu", args),
                 1e-3);
  }
}

// A run stopped after step 2 and resumed on the GPU continues as the
// uninterrupted one: a checkpoint's agreement, broadcasts and gathers cross
// NCCL from host tensors, and the state returns to the device.
// --cpu-offload (the shards and the optimizer on the host, copies on
// streams of their own) and --optimizer-offload (AdamW's moments on the
// host) train as the run without offload: the host's fused AdamW against
// the device's, fp32 rounding apart, 1e-5 relative over 6 steps, at W = 1
// and with 2 ranks sharing the GPU; and the device holds less.
TEST(Cuda, OffloadTrainsAsWithoutItAndHoldsLess) {
  SKIP_WITHOUT_A_GPU();
  const auto dir = make_temp_dir();
  for (const int world : {1, 2}) {
    std::map<std::string, nlohmann::json> last;
    std::map<std::string, std::vector<double>> losses;
    for (const std::string mode : {"", "--cpu-offload", "--optimizer-offload"}) {
      const std::string out = dir + "/w" + std::to_string(world) + (mode.empty() ? "plain" : mode);
      const auto r = run_command(kCli + " launch -n " + std::to_string(world) + " -- " + kCli +
                                 " train --model gpt2-tiny --data synthetic --steps 6 --seq-len 16 --batch-size 2"
                                 " --log-every 1 --device cuda --precision bf16 " + mode + " --out-dir " + out);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const auto metrics = read_metrics(out + "/metrics.jsonl");
      losses[mode] = train_losses(metrics);
      for (const auto& l : metrics) {
        if (l.contains("peak_device_mb")) last[mode] = l;
      }
    }
    for (const std::string mode : {"--cpu-offload", "--optimizer-offload"}) {
      ASSERT_EQ(losses[mode].size(), 6u) << mode;
      for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(losses[mode][i], losses[""][i], 1e-5 * losses[""][i]) << mode << " " << i;
      EXPECT_GT(last[mode]["host_state_mb"].get<double>(), 0.0) << mode;
      EXPECT_LT(last[mode]["peak_device_mb"].get<double>(), last[""]["peak_device_mb"].get<double>()) << mode;
    }
  }
}

TEST(Cuda, ResumedOnTheGpuContinuesExactly) {
  SKIP_WITHOUT_A_GPU();
  const auto dir = make_temp_dir();
  const auto whole = train_on("cuda", dir + "/whole", "--steps 4");
  train_on("cuda", dir + "/part", "--steps 2 --ckpt-dir " + dir + "/ckpt");
  const auto resumed = train_on("cuda", dir + "/resumed", "--steps 4 --resume --ckpt-dir " + dir + "/ckpt");
  ASSERT_EQ(whole.size(), 4u);
  expect_close(resumed, {whole[2], whole[3]}, 1e-5);  // GPU kernels may reduce in another order
}

// A model built from a Hugging Face directory is deferred (no memory behind
// its parameters) and must stay so on its way to the GPU, where fully_shard
// reads each weight from the files: its first loss is the CPU's from the
// same weights, not that of one uninitialised value.
TEST(Cuda, InitFromAHuggingFaceDirectoryLoadsItsWeights) {
  SKIP_WITHOUT_A_GPU();
  const auto dir = make_temp_dir();
  train_on("cpu", dir + "/source", "--model llama-tiny --steps 2 --export-hf " + dir + "/hf");
  const auto args = "--steps 2 --init-from " + dir + "/hf";
  expect_close(train_on("cuda", dir + "/cuda", args), train_on("cpu", dir + "/cpu", args), 1e-3);
}

// Recomputation replays the forward's dropout masks, drawn from the GPU's
// generator: with checkpointing the losses are those without.
TEST(Cuda, CheckpointingReplaysTheGpuDropoutMasks) {
  SKIP_WITHOUT_A_GPU();
  const auto dir = make_temp_dir();
  const auto args = std::string("--model gpt2-tiny --steps 3 --dropout 0.2");
  expect_close(train_on("cuda", dir + "/ac", args + " --activation-checkpoint"), train_on("cuda", dir + "/plain", args),
               1e-5);
}

// Generation feeds the GPU model device tokens and samples on the host:
// greedy decoding picks what the same weights pick on the CPU, and sampling
// with a temperature runs.
TEST(Cuda, GeneratesFromAGpuModelAsFromTheCpu) {
  SKIP_WITHOUT_A_GPU();
  torch::manual_seed(0);
  auto cpu_model = models::build_preset("gpt2-tiny");
  auto gpu_model = models::build_preset("gpt2-tiny");
  {
    torch::NoGradGuard no_grad;
    auto from = cpu_model->named_parameters();
    for (auto& p : gpu_model->named_parameters()) p.value().copy_(from[p.key()]);
  }
  gpu_model->to(torch::kCUDA);
  train::SampleOptions greedy;
  greedy.max_new_tokens = 12;
  greedy.temperature = 0;
  const std::vector<int32_t> prompt{1, 2, 3};
  EXPECT_EQ(train::generate(gpu_model, prompt, greedy), train::generate(cpu_model, prompt, greedy));
  train::SampleOptions sampled;
  sampled.max_new_tokens = 12;
  EXPECT_EQ(train::generate(gpu_model, prompt, sampled).size(), 12u);
}

// FSDP frees a gathered unit by shrinking its storage to nothing and
// regrows it for the next gather; views made before must see the new memory.
TEST(Cuda, StorageFreedAndRegrownInPlaceKeepsViews) {
  SKIP_WITHOUT_A_GPU();
  auto flat = torch::arange(8, torch::dtype(torch::kFloat).device(torch::kCUDA));
  auto view = flat.narrow(0, 2, 4);
  compat::resize_storage_bytes(flat, 0);
  EXPECT_EQ(flat.storage().nbytes(), 0u);
  compat::resize_storage_bytes(flat, 8 * sizeof(float));
  flat.copy_(torch::arange(10, 18, torch::dtype(torch::kFloat)));
  EXPECT_TRUE(torch::equal(view.cpu(), torch::arange(12, 16, torch::dtype(torch::kFloat))));
}

// Clipping on the GPU (per-gradient fp32 norms, squared and summed in
// double) gives the norm a double sum of squares gives, and scales every
// gradient by the factor the CPU's clipping applies.
TEST(Cuda, GradientNormAndClippingOnTheGpuMatchTheCpu) {
  SKIP_WITHOUT_A_GPU();
  torch::manual_seed(3);
  torch::nn::Sequential cpu(torch::nn::Linear(257, 129), torch::nn::Linear(129, 5), torch::nn::LayerNorm(
      torch::nn::LayerNormOptions({5})));
  auto gpu = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(cpu->clone(torch::kCUDA));
  ASSERT_TRUE(gpu);
  double by_hand = 0, largest = 0;
  const auto cpu_params = cpu->parameters(), gpu_params = gpu->parameters();
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    auto g = torch::randn(cpu_params[i].sizes()) * static_cast<double>(i + 1);
    cpu_params[i].mutable_grad() = g.clone();
    gpu_params[i].mutable_grad() = g.to(torch::kCUDA);
    by_hand += g.to(torch::kDouble).square().sum().item<double>();
    largest = std::max(largest, g.abs().max().item<double>());
  }
  by_hand = std::sqrt(by_hand);
  EXPECT_NEAR(grad_norm(*gpu, INFINITY), largest, 0.0);
  const double cpu_norm = clip_grad_norm_(*cpu, 1.0), gpu_norm = clip_grad_norm_(*gpu, 1.0);
  EXPECT_NEAR(cpu_norm, by_hand, 1e-12 * by_hand);
  EXPECT_NEAR(gpu_norm, by_hand, 1e-6 * by_hand);
  double clipped = 0;
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(gpu_params[i].grad().cpu(), cpu_params[i].grad(), 1e-6, 1e-7)) << i;
    clipped += gpu_params[i].grad().to(torch::kDouble).square().sum().item<double>();
  }
  EXPECT_NEAR(std::sqrt(clipped), 1.0, 1e-5);
}

// [Note: many ranks on one GPU]: W ranks share the one GPU, their
// collectives staged through host shared memory. ARGS are `fsdp train`
// arguments; the global batch is 4 sequences, split over the ranks.
struct SharedGpuRun {
  int exit_code = 0;
  std::string output;
  std::vector<double> losses;
};
SharedGpuRun train_sharing_the_gpu(int ranks, const std::string& dir, const std::string& args) {
  const auto r = run_command(kCli + " launch -n " + std::to_string(ranks) + " -- " + kCli +
                             " train --model gpt2-tiny --data synthetic --steps 4 --seq-len 16 --log-every 1"
                             " --grad-clip 0 --lr 1e-3 --device cuda --batch-size " + std::to_string(4 / ranks) +
                             " --out-dir " + dir + " " + args);
  SharedGpuRun run{r.exit_code, r.output, {}};
  if (r.exit_code == 0) run.losses = train_losses(read_metrics(dir + "/metrics.jsonl"));
  return run;
}

// Every strategy, with 2 and 4 ranks on the one GPU, trains as one rank on
// it does on the same global batch: fp32 losses within 1e-5. The launch says
// in one line that the ranks share the GPU and NCCL is not used.
TEST(Cuda, ManyRanksShareOneGpuAndTrainAsOneRank) {
  SKIP_WITHOUT_A_GPU();
  if (torch::cuda::device_count() > 1) GTEST_SKIP() << "several GPUs: each rank gets its own, over NCCL";
  const auto dir = make_temp_dir();
  const auto one = train_sharing_the_gpu(1, dir + "/w1", "");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(one.losses.size(), 4u);
  const std::vector<std::pair<int, std::string>> cases = {
      {2, "--sharding full_shard"}, {2, "--sharding shard_grad_op"}, {2, "--sharding no_shard"},
      {4, "--sharding full_shard"}, {4, "--sharding hybrid_shard --fsdp-size 2"}};
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [ranks, args] = cases[i];
    SCOPED_TRACE(std::to_string(ranks) + " ranks, " + args);
    const auto shared = train_sharing_the_gpu(ranks, dir + "/case" + std::to_string(i), args);
    ASSERT_EQ(shared.exit_code, 0) << shared.output;
    EXPECT_TRUE(contains(shared.output, std::to_string(ranks) + " ranks share cuda:0")) << shared.output;
    EXPECT_TRUE(contains(shared.output, "shared memory")) << shared.output;
    expect_close(shared.losses, one.losses, 1e-5);
  }
}

// bf16 parameters and compute, fp32 reduction, on 2 ranks sharing the GPU:
// the losses of one rank within bf16's resolution.
TEST(Cuda, ManyRanksShareOneGpuInBf16) {
  SKIP_WITHOUT_A_GPU();
  if (torch::cuda::device_count() > 1) GTEST_SKIP() << "several GPUs: each rank gets its own, over NCCL";
  const auto dir = make_temp_dir();
  const auto one = train_sharing_the_gpu(1, dir + "/w1", "--precision bf16");
  const auto two = train_sharing_the_gpu(2, dir + "/w2", "--precision bf16");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  expect_close(two.losses, one.losses, 2e-2);
}

// NCCL asked for where ranks share a GPU: refused before any rank connects,
// naming the reason and the way out.
TEST(Cuda, NcclIsRefusedWhereRanksShareAGpu) {
  SKIP_WITHOUT_A_GPU();
  if (torch::cuda::device_count() > 1) GTEST_SKIP() << "several GPUs: each rank gets its own, over NCCL";
  const auto dir = make_temp_dir();
  const auto r = train_sharing_the_gpu(2, dir + "/nccl", "--backend nccl");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "backend 'nccl' takes one rank per GPU, and 2 ranks of this host share cuda:0"))
      << r.output;
}

}  // namespace
}  // namespace fsdp::testing::cuda_test
