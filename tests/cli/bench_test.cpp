// fsdp bench matmul and fsdp bench kernels: the step's matmul FLOPs against
// the textbook count, and what the commands refuse. Timings themselves are
// not asserted (bench/run_benchmarks.py reports them).

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "../test_paths.h"
#include "fsdp/bench/kernel_bench.h"
#include "run_command.h"

namespace fsdp::testing::bench_test {
namespace {

const std::string kCli = kCliProgram;

nlohmann::json matmul_json(const std::string& flags) {
  const auto r = run_command("OMP_NUM_THREADS=1 " + kCli + " bench matmul --json --seconds 0.01 " + flags);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::istringstream lines(r.output);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (!line.empty() && line[0] == '{') last = line;
  }
  return last.empty() ? nlohmann::json::object() : nlohmann::json::parse(last);
}

// Training FLOPs of the matmuls, counted the textbook way: 6 per weight per
// token (forward, input gradient, weight gradient) plus attention's six
// T x T x hs products per head and sequence over the whole square
// (12 B T^2 H hs a layer); checkpointing repeats the blocks' forward part
// (2 per weight per token, 4 B T^2 H hs a layer).
double textbook_flops(double block_weights, double head_weights, double layers, double batch, double seq,
                      double heads_width, bool recompute) {
  const double tokens = batch * seq;
  double flops = 6 * (block_weights * layers + head_weights) * tokens + 12 * batch * seq * seq * heads_width * layers;
  if (recompute) flops += 2 * block_weights * layers * tokens + 4 * batch * seq * seq * heads_width * layers;
  return flops;
}

TEST(BenchMatmul, StepFlopsAreTheTextbookCountForGpt2AndLlama) {
  // gpt2-tiny: C 32, 2 layers, vocab 512 (tied head); per block 12 C^2.
  const double C = 32;
  auto gpt2 = matmul_json("--model gpt2-tiny --batch-size 3 --seq-len 40");
  EXPECT_DOUBLE_EQ(gpt2.value("step_flops", 0.0), textbook_flops(12 * C * C, 512 * C, 2, 3, 40, C, false));
  auto recomputed = matmul_json("--model gpt2-tiny --batch-size 3 --seq-len 40 --activation-checkpoint");
  EXPECT_DOUBLE_EQ(recomputed.value("step_flops", 0.0), textbook_flops(12 * C * C, 512 * C, 2, 3, 40, C, true));
  // llama-tiny: C 64, 4 heads of 16, 2 key/value heads, MLP 176, 2 layers.
  const double c = 64, kv = 2 * 16, ffn = 176;
  const double block = c * c + 2 * c * kv + c * c + 3 * c * ffn;
  auto llama = matmul_json("--model llama-tiny --batch-size 2 --seq-len 64");
  EXPECT_DOUBLE_EQ(llama.value("step_flops", 0.0), textbook_flops(block, 512 * c, 2, 2, 64, c, false));
}

TEST(BenchMatmul, EveryProductHasARateAndTheLimitIsTheirSum) {
  const auto r = matmul_json("--model llama-tiny --batch-size 2 --seq-len 32 --precision bf16");
  EXPECT_EQ(r.value("dtype", ""), "BFloat16");
  double sum = 0;
  ASSERT_TRUE(r.contains("products"));
  for (const auto& p : r["products"]) {
    EXPECT_GT(p.value("seconds", 0.0), 0.0) << p.dump();
    sum += p.value("seconds", 0.0) * p.value("count", 0);
  }
  EXPECT_GE(r["products"].size(), 25u) << "7 Linears x 3, 6 attention products, the head's 3";
  EXPECT_NEAR(r.value("matmul_limited_s", 0.0), sum, 1e-9 * sum);
}

TEST(BenchErrors, UnknownDtypesAndModelsWithoutShapesAreRefused) {
  auto r = run_command(kCli + " bench matmul --model gpt2-tiny --dtypes fp16");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--dtypes"), std::string::npos) << r.output;
  r = run_command(kCli + " bench matmul --model gpt2-tiny --precision fp16");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--precision fp16 is not timed"), std::string::npos) << r.output;
  r = run_command(kCli + " bench matmul --model example");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("no memory formula for the example family"), std::string::npos) << r.output;
  r = run_command(kCli + " bench kernels --model gpt2-tiny --seconds 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--seconds"), std::string::npos) << r.output;
}

TEST(BenchKernels, TimesOursBesideLibTorchsOperators) {
  const auto r = run_command("OMP_NUM_THREADS=1 " + kCli + " bench kernels --model llama-tiny --seconds 0.01");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* row : {"causal attention forward+backward, Float", "causal attention forward+backward, BFloat16",
                          "AdamW step, fp32", "RMS norm forward+backward, BFloat16",
                          "SwiGLU activation forward+backward, BFloat16", "at::silu, at::mul"}) {
    EXPECT_NE(r.output.find(row), std::string::npos) << row << " missing:\n" << r.output;
  }
#if FSDP_BENCH_HAS_ATEN_KERNELS
  EXPECT_NE(r.output.find("at::scaled_dot_product_attention"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("at::_fused_adamw_"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("at::rms_norm"), std::string::npos) << r.output;
#endif
  // GPT-2 has neither RMS norms nor SwiGLU: no rows for them.
  const auto gpt2 = run_command("OMP_NUM_THREADS=1 " + kCli + " bench kernels --model gpt2-tiny --seconds 0.01");
  ASSERT_EQ(gpt2.exit_code, 0) << gpt2.output;
  EXPECT_EQ(gpt2.output.find("RMS norm"), std::string::npos) << gpt2.output;
  EXPECT_EQ(gpt2.output.find("SwiGLU"), std::string::npos) << gpt2.output;
}

}  // namespace
}  // namespace fsdp::testing::bench_test
