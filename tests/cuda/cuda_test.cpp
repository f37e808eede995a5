// The CUDA path, run where a GPU is visible (label `cuda`). Elsewhere each
// test skips, saying why: a CPU build, or a CUDA build with no device.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../cli/run_command.h"
#include "../cli/train_support.h"
#include "fsdp/common/compat.h"

namespace fsdp::testing {
namespace {

const std::string kCli = FSDP_CLI;

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

}  // namespace
}  // namespace fsdp::testing
