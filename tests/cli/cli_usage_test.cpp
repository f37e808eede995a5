// The command line's own manners, as a new user met them: a flag given
// where a value belongs, a mistyped command, a range message, and --help
// (one way to show a default, nothing of CLI11's internals, every model
// family named).

#include <filesystem>
#include <regex>
#include <sstream>

#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "../test_paths.h"
#include "fsdp/models/registry.h"
#include "fsdp/train/config.h"
#include "run_command.h"

namespace fsdp::testing::cli_usage_test {
namespace {

const std::string kCli = kCliProgram;

// Every command that has options, as the words that reach it.
const std::vector<std::string> kCommands = {"",          "launch",       "smoke",       "bench comm",
                                            "bench step", "data prepare", "data encode", "train",
                                            "generate",   "ckpt inspect", "ckpt export", "ckpt import"};

TEST(CliUsage, AFlagWhereAValueBelongsIsNamedWithWhatWasExpected) {
  // CLI11 used to take --steps as --lr's value and then complain about "3".
  const auto lr = run_command(kCli + " train --lr --steps 3");
  EXPECT_EQ(lr.exit_code, 2) << lr.output;
  EXPECT_TRUE(contains(lr.output, "--lr: expected a number, got the flag '--steps'")) << lr.output;
  const auto steps = run_command(kCli + " train --steps --print-config");
  EXPECT_EQ(steps.exit_code, 2) << steps.output;
  EXPECT_TRUE(contains(steps.output, "--steps: expected an integer, got the flag '--print-config'")) << steps.output;
  const auto data = run_command(kCli + " train --data --steps 3");
  EXPECT_EQ(data.exit_code, 2) << data.output;
  EXPECT_TRUE(contains(data.output, "--data: expected a value, got the flag '--steps'")) << data.output;
  const auto ranks = run_command(kCli + " launch -n --nnodes 2 -- true");
  EXPECT_EQ(ranks.exit_code, 2) << ranks.output;
  EXPECT_TRUE(contains(ranks.output, "--nproc-per-node: expected an integer, got the flag '--nnodes'")) << ranks.output;
  // A negative number is still a value (and a bad one is explained by its key).
  const auto seed = run_command(kCli + " train --seed -5 --print-config");
  ASSERT_EQ(seed.exit_code, 0) << seed.output;
  EXPECT_TRUE(contains(seed.output, "seed: -5\n")) << seed.output;
  const auto negative = run_command(kCli + " train --lr -1 --print-config");
  EXPECT_EQ(negative.exit_code, 1) << negative.output;
  EXPECT_TRUE(contains(negative.output, "optim.lr is -1: expected a positive learning rate")) << negative.output;
}

TEST(CliUsage, OutOfRangeValuesGetShortMessages) {
  // CLI::NonNegativeNumber printed its upper bound, DBL_MAX, in 309 digits.
  const auto cold = run_command(kCli + " generate --from /tmp --temperature -1");
  EXPECT_EQ(cold.exit_code, 2) << cold.output;
  EXPECT_TRUE(contains(cold.output, "--temperature: expected 0 (greedy) or at least 1e-6, got -1")) << cold.output;
  EXPECT_LT(cold.output.size(), 200u) << cold.output;
  // Values that LibTorch would have failed on, or that meant nothing.
  for (const auto& [flag, message] : std::vector<std::pair<std::string, std::string>>{
           {"--temperature 1e-45", "--temperature: expected 0 (greedy) or at least 1e-6, got 1e-45"},
           {"--max-new-tokens -1", "--max-new-tokens: expected 0 or more, got -1"},
           {"--top-k -5", "--top-k: expected 0 or more, got -5"}}) {
    const auto r = run_command(kCli + " generate --from /tmp " + flag);
    EXPECT_EQ(r.exit_code, 2) << flag << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, message)) << r.output;
  }
  // A step count whose tokens a checkpoint could not count.
  const auto endless = run_command(kCli + " train --model gpt2-tiny --data synthetic --seq-len 16 --batch-size 2 "
                                   "--steps 9223372036854775807 --out-dir /tmp/fsdp-never-made");
  EXPECT_EQ(endless.exit_code, 1) << endless.output;
  EXPECT_TRUE(contains(endless.output, "--steps 9223372036854775807 at 32 tokens per step")) << endless.output;
  EXPECT_FALSE(std::filesystem::exists("/tmp/fsdp-never-made"));
  EXPECT_FALSE(std::regex_search(endless.output, std::regex(" -[0-9]"))) << "a negative count\n" << endless.output;
  const auto huge = run_command(kCli + " train --lr 1e999 --print-config");
  EXPECT_EQ(huge.exit_code, 1) << huge.output;
  EXPECT_TRUE(contains(huge.output, "optim.lr is '1e999': expected a finite number")) << huge.output;
  const auto wide = run_command(kCli + " train --steps 99999999999999999999 --print-config");
  EXPECT_EQ(wide.exit_code, 1) << wide.output;
  EXPECT_TRUE(contains(wide.output, "expected an integer from -2^63 to 2^63-1")) << wide.output;
}

TEST(CliUsage, AnUnknownCommandNamesTheClosestOne) {
  const auto top = run_command(kCli + " trian --steps 3");
  EXPECT_EQ(top.exit_code, 2) << top.output;
  EXPECT_TRUE(contains(top.output, "unknown command 'trian'; did you mean 'train'?")) << top.output;
  EXPECT_TRUE(contains(top.output, "commands: launch, smoke")) << top.output;
  const auto nested = run_command(kCli + " ckpt exprot a b");
  EXPECT_EQ(nested.exit_code, 2) << nested.output;
  EXPECT_TRUE(contains(nested.output, "unknown command 'exprot' for 'fsdp ckpt'; did you mean 'export'?"))
      << nested.output;
}

TEST(CliUsage, AMistypedOptionIsNamedAsTypedWithTheClosestOne) {
  // CLI11 said "The following arguments were not expected: 3 --stpes".
  const auto typo = run_command(kCli + " train --stpes 3");
  EXPECT_EQ(typo.exit_code, 2) << typo.output;
  EXPECT_EQ(typo.output, "error: unknown option '--stpes' for 'fsdp train'; did you mean '--steps'? (`fsdp train "
                         "--help` lists its options)\n");
  const auto stray = run_command(kCli + " train --steps 3 extra");
  EXPECT_EQ(stray.exit_code, 2) << stray.output;
  EXPECT_TRUE(contains(stray.output, "error: unexpected argument 'extra' for 'fsdp train'")) << stray.output;
}

TEST(CliUsage, HelpAsACommandPrintsTheHelp) {
  const auto top = run_command(kCli + " help");
  EXPECT_EQ(top.exit_code, 0) << top.output;
  EXPECT_EQ(top.output, run_command(kCli + " --help").output);
  const auto train = run_command(kCli + " help train");
  EXPECT_EQ(train.exit_code, 0) << train.output;
  EXPECT_EQ(train.output, run_command(kCli + " train --help").output);
}

TEST(CliUsage, WarmUpPastTheRunIsWarnedAndTheFirstEtaIsAGuessFromTheStepItself) {
  const auto r = run_command(kCli + " train --model gpt2-tiny --data synthetic --seq-len 16 --batch-size 2 "
                             "--steps 4 --log-every 1 --warmup-steps 500 --lr 0.001");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // 0.001 x 4 / 500 at the last step.
  EXPECT_TRUE(contains(r.output, "warning: --warmup-steps 500 is more than --steps 4: the learning rate rises for the "
                                 "whole run and ends at 8e-06, never reaching --lr 0.001"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "step 1/4 ")) << r.output;
  const auto first = r.output.find("step 1/4 ");
  const auto line = r.output.substr(first, r.output.find('\n', first) - first);
  EXPECT_TRUE(contains(line, "ETA ~")) << "the first ETA is a guess, marked so: " << line;
  const auto ok = run_command(kCli + " train --model gpt2-tiny --data synthetic --seq-len 16 --batch-size 2 "
                              "--steps 4 --warmup-steps 2");
  EXPECT_FALSE(contains(ok.output, "--warmup-steps")) << ok.output;
  // As many warm-up steps as steps: the last step trains at --lr (0.002 x
  // 3 / 3), so there is nothing to warn about (it said "ends at 0.002,
  // never reaching --lr 0.002").
  const auto equal = run_command(kCli + " train --model gpt2-tiny --data synthetic --seq-len 16 --batch-size 2 "
                                 "--steps 3 --warmup-steps 3 --lr 0.002 --log-every 1");
  EXPECT_EQ(equal.exit_code, 0) << equal.output;
  EXPECT_FALSE(contains(equal.output, "--warmup-steps")) << equal.output;
  EXPECT_TRUE(contains(equal.output, "step 3/3 ") && contains(equal.output, "lr 2.00e-03")) << equal.output;
}

TEST(CliUsage, EveryHelpShowsDefaultsOneWayAndNoCli11Internals) {
  // CLI11's own style put a default after the type ("INT=64") and a flag's
  // value after its name ("--no-prefix{false}").
  const std::regex type_default(R"((INT|UINT|FLOAT|TEXT|BOOL\]|[a-z0-9_]+\|[a-z0-9_|]+)=)");
  for (const auto& command : kCommands) {
    const auto r = run_command(kCli + " " + command + " --help");
    ASSERT_EQ(r.exit_code, 0) << command << ": " << r.output;
    EXPECT_FALSE(std::regex_search(r.output, type_default)) << command << ": " << r.output;
    EXPECT_FALSE(contains(r.output, "{false}") || contains(r.output, "{true}")) << command << ": " << r.output;
    EXPECT_FALSE(contains(r.output, "(default \"\\\"\\\"\")")) << command << ": " << r.output;
    // A default holding a newline (sample_prompt's) used to break its line
    // after "TEXT=".
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) {
      EXPECT_TRUE(line.empty() || line.back() != '=') << command << ": '" << line << "'";
    }
  }
  const auto train = run_command(kCli + " train --help");
  for (const char* needle :
       {"--lr FLOAT ", "peak learning rate (optim.lr) (default 0.0003)\n", "--precision fp32|bf16|fp16 ",
        "(runtime.precision) (default fp32)\n", "--tensorboard [BOOL] ", "(logging.tensorboard) (default true)\n",
        "(sample.prompt) (default \"\\n\")\n", "(model.vocab_size) (default 0)\n",
        "sections model, lora, objective, data, optim, runtime, logging, eval, sample, export, guard, fsdp, checkpoint"}) {
    EXPECT_TRUE(contains(train.output, needle)) << needle << " in " << train.output;
  }
  // An empty default shows none.
  EXPECT_TRUE(contains(train.output, "(model.init_from)\n")) << train.output;
  const auto launch = run_command(kCli + " launch --help");
  EXPECT_TRUE(contains(launch.output, "ranks to start on this node (default 1)\n")) << launch.output;
  EXPECT_TRUE(contains(launch.output, "--no-prefix ")) << launch.output;
}

TEST(CliUsage, TopLevelHelpNamesEveryModelFamily) {
  const auto r = run_command(kCli + " --help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& family : models::families()) {
    EXPECT_TRUE(contains(r.output, family.name)) << family.name << " in " << r.output;
  }
  EXPECT_TRUE(contains(r.output, "qwen3")) << r.output;
}

}  // namespace
}  // namespace fsdp::testing::cli_usage_test
