// Ranks agree on the job before they train ([Note: ranks agree on the
// job]): ranks started with different settings, models or data fail at
// start-up with one message naming each rank, key and value, instead of
// training silently apart or dying inside Gloo. Each rank's command is
// made to differ by its RANK, as a mistyped node's command would.

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "../test_paths.h"
#include "fsdp/train/config.h"
#include "fsdp/train/job_agreement.h"
#include "run_command.h"
#include "train_support.h"

namespace fsdp::testing::job_agreement_test {
namespace {

namespace fs = std::filesystem;
const std::string kCli = kCliProgram;

// `fsdp launch -n W` of one train command in which `$RANK` may appear.
CommandResult launch_per_rank(int world, const std::string& dir, const std::string& args) {
  return run_command(kCli + " launch -n " + std::to_string(world) + " -- bash -c '" + kCli +
                     " train --data synthetic --steps 2 --seq-len 16 --batch-size 2 --out-dir " + dir + "/run " +
                     args + "'");
}

const char* const kPreamble = "error: the ranks were started with different jobs (every rank must run the same "
                              "command, configuration, data and build): ";

TEST(JobAgreement, SettingsThatTrainedSilentlyApartAreNamedByRankAndKey) {
  const auto dir = make_temp_dir();
  const auto r = launch_per_rank(
      3, dir, "--model gpt2-tiny --lr 0.00$((3 + RANK % 2)) --seed $((1 + RANK / 2)) --grad-clip 1 --weight-decay 0.1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, std::string(kPreamble) +
                                     "rank 1 has optim.lr 0.004 (rank 0: 0.003); rank 2 has runtime.seed 2 (rank 0: 1)"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "step 1/")) << "a step ran before the ranks agreed\n" << r.output;
  EXPECT_FALSE(exists(dir + "/run")) << "the refused start left its run folder";
  fs::remove_all(dir);
}

TEST(JobAgreement, AnotherModelIsNamedInsteadOfAGlooError) {
  const auto dir = make_temp_dir();
  const auto r = launch_per_rank(2, dir, "--model $([ $RANK = 0 ] && echo gpt2-tiny || echo llama-tiny)");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1 has model.name \"llama-tiny\" (rank 0: \"gpt2-tiny\")")) << r.output;
  EXPECT_FALSE(contains(r.output, "EnforceNotMet")) << r.output;
  fs::remove_all(dir);
}

TEST(JobAgreement, DataFilesOfAnotherSizeAreNamed) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  // Rank 1 reads a copy cut short: the same name on another node, say.
  fs::create_directories(dir + "/node1");
  fs::copy_file(corpus, dir + "/node1/train.bin");
  fs::resize_file(dir + "/node1/train.bin", fs::file_size(corpus) - 2);
  const auto r = run_command(kCli + " launch -n 2 -- bash -c '" + kCli +
                             " train --model gpt2-tiny --steps 2 --seq-len 16 --batch-size 2 --out-dir " + dir +
                             "/run --data $([ $RANK = 0 ] && echo " + corpus + " || echo " + dir +
                             "/node1/train.bin)'");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1 has data.train \"" + dir + "/node1/train.bin\" (rank 0: \"" + corpus + "\")"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "data.train file " + std::to_string(fs::file_size(corpus) - 2) + " bytes (rank 0: " +
                                     std::to_string(fs::file_size(corpus)) + " bytes)"))
      << r.output;
  fs::remove_all(dir);
}

TEST(JobAgreement, TheSameJobOnEveryRankTrains) {
  const auto dir = make_temp_dir();
  const auto r = launch_per_rank(2, dir, "--model gpt2-tiny");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  fs::remove_all(dir);
}

TEST(JobAgreement, SettingsCoverEveryConfigurationKeyAndTheBuild) {
  train::TrainConfig config;
  config.data.train = "synthetic";
  const auto settings = train::job_settings(config);
  // Every key of config.yaml, by its dotted name, and the build.
  for (const char* key : {"model.name", "data.seq_len", "data.batch_size", "optim.lr", "optim.weight_decay",
                          "optim.grad_clip", "runtime.seed", "runtime.precision", "fsdp.sharding", "model.vocab_size"}) {
    EXPECT_TRUE(settings.count(key)) << key;
  }
  EXPECT_TRUE(contains(settings.at("build"), "LibTorch ")) << settings.at("build");
  auto other = settings;
  other["optim.lr"] = "0.5";
  other.erase("runtime.seed");
  const auto differences = train::setting_differences(other, settings);
  ASSERT_EQ(differences.size(), 2u);
  EXPECT_EQ(differences[0], "optim.lr 0.5 (rank 0: " + settings.at("optim.lr") + ")");
  EXPECT_EQ(differences[1], "runtime.seed (none) (rank 0: " + settings.at("runtime.seed") + ")");
  EXPECT_EQ(train::parse_settings_text(train::settings_text(settings)), settings);
}

}  // namespace
}  // namespace fsdp::testing::job_agreement_test
