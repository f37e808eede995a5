// What a new user met on a first walk through `fsdp train` (issue 31's
// frictions), each checked as they met it: a preset on real token files,
// a run that keeps nothing, the tokenizer from another directory, what
// data a run reads, a failed start, the rank log, and a damaged `latest`.

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "../test_paths.h"
#include "fsdp/data/token_file.h"
#include "run_command.h"
#include "train_support.h"

namespace fsdp::testing::new_user_test {
namespace {

namespace fs = std::filesystem;
const std::string kCli = kCliProgram;

CommandResult train(const std::string& args) {
  return run_command(kCli + " train --model gpt2-tiny --seq-len 16 --batch-size 2 --log-every 1 " + args);
}

// A token file whose largest id is 700: beyond gpt2-tiny's 512 rows.
std::string corpus_beyond_512(const std::string& dir) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back((i * 37) % 701);
  const std::string path = dir + "/wide.bin";
  data::write_token_file(path, tokens);
  return path;
}

TEST(NewUser, APresetTakesTokenFilesBeyondItsVocabularyWithVocabSize) {
  const auto dir = make_temp_dir();
  const auto corpus = corpus_beyond_512(dir);
  const auto refused = train("--data " + corpus + " --steps 2 --out-dir " + dir + "/refused");
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  // The id, the flag with a size that holds it (rounded up to 64), and a preset that fits.
  EXPECT_TRUE(contains(refused.output, "holds token id 700")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "--vocab-size 704")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "gpt2-mini (vocabulary 50257)")) << refused.output;

  const auto r = train("--data " + corpus + " --steps 2 --vocab-size 704 --out-dir " + dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "vocabulary 704")) << r.output;
  // The recorded configuration reproduces the run.
  EXPECT_TRUE(contains(read_file(dir + "/run/config.yaml"), "vocab_size: 704"));

  const auto hf = train("--data " + corpus + " --steps 1 --vocab-size 704 --init-from " + dir + "/nowhere");
  EXPECT_NE(hf.exit_code, 0);
  EXPECT_TRUE(contains(hf.output, "--vocab-size resizes a preset")) << hf.output;
  fs::remove_all(dir);
}

TEST(NewUser, ARunThatKeepsNoWeightsSaysSoAtTheStart) {
  const auto dir = make_temp_dir();
  const auto nothing = train("--steps 1 --out-dir " + dir + "/a");
  ASSERT_EQ(nothing.exit_code, 0) << nothing.output;
  EXPECT_TRUE(contains(nothing.output, "the trained weights are not kept")) << nothing.output;
  const auto saved = train("--steps 1 --save-every 1 --out-dir " + dir + "/b");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  EXPECT_FALSE(contains(saved.output, "not kept")) << saved.output;
  const auto exported = train("--steps 1 --export-hf " + dir + "/hf --out-dir " + dir + "/c");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_FALSE(contains(exported.output, "not kept")) << exported.output;
  fs::remove_all(dir);
}

TEST(NewUser, TheDataARunReadsIsNamedWithItsTokenCounts) {
  const auto dir = make_temp_dir();
  const auto synthetic = train("--steps 1 --out-dir " + dir + "/a");
  ASSERT_EQ(synthetic.exit_code, 0) << synthetic.output;
  EXPECT_TRUE(contains(synthetic.output, "data: synthetic (random tokens")) << synthetic.output;
  // 1 rank x 2 sequences x 16 tokens.
  EXPECT_TRUE(contains(synthetic.output, "32 tokens per step, 32 in 1 steps")) << synthetic.output;
  const auto corpus = small_corpus(dir);
  const auto files = train("--data " + corpus + " --val-data " + corpus + " --steps 2 --out-dir " + dir + "/b");
  ASSERT_EQ(files.exit_code, 0) << files.output;
  EXPECT_TRUE(contains(files.output, "data: " + corpus + " (1 file(s), 20000 tokens)")) << files.output;
  EXPECT_TRUE(contains(files.output, "validation data: " + corpus + " (1 file(s), 20000 tokens)")) << files.output;
  fs::remove_all(dir);
}

TEST(NewUser, TheDefaultTokenizerIsFoundFromAnotherDirectory) {
  // data/gpt2 comes from scripts/fetch_data.sh, under the repository.
  if (!fs::exists(std::string(kSourceDir) + "/data/gpt2/encoder.json")) {
    GTEST_SKIP() << "data/gpt2 not fetched (scripts/fetch_data.sh)";
  }
  const auto dir = make_temp_dir();
  const auto r = run_command("cd " + dir + " && " + kCli +
                             " train --model gpt2-tiny --seq-len 16 --batch-size 2 --steps 1 --sample-tokens 3" +
                             " --sample-prompt a --out-dir run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "samples use the tokenizer")) << r.output;
  EXPECT_TRUE(contains(r.output, "--- sample (")) << r.output;
  fs::remove_all(dir);
}

TEST(NewUser, AFailedStartLeavesNoRunFolderItMadeAndKeepsOneThatWasThere) {
  const auto dir = make_temp_dir();
  const auto fresh = train("--data " + dir + "/missing.bin --steps 1 --out-dir " + dir + "/new");
  EXPECT_NE(fresh.exit_code, 0);
  EXPECT_FALSE(fs::exists(dir + "/new")) << fresh.output;
  fs::create_directories(dir + "/kept");
  const auto existing = train("--data " + dir + "/missing.bin --steps 1 --out-dir " + dir + "/kept");
  EXPECT_NE(existing.exit_code, 0);
  EXPECT_TRUE(fs::is_directory(dir + "/kept"));
  // The folders a start makes above its run folder go too (out/ of the
  // default out/<run>, --ckpt-dir's and --export-hf's parents), whichever
  // input was bad: the model, the Hugging Face directory or the data.
  for (const std::string& bad : {std::string("--model nope --data synthetic"),
                                "--init-from " + dir + "/no-such-model --data synthetic",
                                "--data " + dir + "/missing.bin"}) {
    const auto r = run_command("cd " + dir + " && " + kCli + " train --steps 1 " + bad +
                               " --ckpt-dir c/d --export-hf e/f");
    EXPECT_NE(r.exit_code, 0) << r.output;
    for (const char* made : {"out", "c", "e"}) EXPECT_FALSE(fs::exists(dir + "/" + made)) << bad << ": " << made;
  }
  fs::remove_all(dir);
}

// A launcher stops a job whose other rank failed at start-up with SIGTERM,
// and a user stops a slow start with Ctrl-C: the folders the start made go
// as on an error, and the process still dies of the signal.
TEST(NewUser, AStartStoppedBySignalLeavesNoFolderItMadeAndKeepsOneThatWasThere) {
  const auto dir = make_temp_dir();
  const std::string stop = "env FSDP_FAULT_POINT=train.start_folders_made:";
  const auto fresh = run_command("cd " + dir + " && " + stop + "TERM " + kCli +
                                 " train --steps 1 --data synthetic --ckpt-dir c/d --export-hf e/f");
  EXPECT_EQ(fresh.exit_code, 128 + SIGTERM) << fresh.output;
  EXPECT_TRUE(contains(fresh.output, "fault point train.start_folders_made reached")) << fresh.output;
  for (const char* made : {"out", "c", "e"}) EXPECT_FALSE(fs::exists(dir + "/" + made)) << made << "\n" << fresh.output;
  fs::create_directories(dir + "/kept");
  const auto existing =
      run_command(stop + "INT " + kCli + " train --steps 1 --data synthetic --out-dir " + dir + "/kept");
  EXPECT_EQ(existing.exit_code, 128 + SIGINT) << existing.output;
  EXPECT_TRUE(fs::is_directory(dir + "/kept"));
  EXPECT_TRUE(fs::is_empty(dir + "/kept")) << "the stopped start left its lock in a folder it did not make";
  fs::remove_all(dir);
}

// A stop after the run's files are written and before step 1 (the
// measurement of peak FLOP/s, the first step's set-up) ends as a stop in
// the run does: after a step, saved, said, and resumable. It died of the
// signal with no word before, its files written.
TEST(NewUser, AStopBeforeTheFirstStepSavesAndSaysSo) {
  const auto dir = make_temp_dir();
  const std::string args = " train --model gpt2-tiny --data synthetic --seq-len 16 --batch-size 2 --log-every 1 "
                           "--out-dir " + dir + "/run";
  const auto stopped = run_command("env FSDP_FAULT_POINT=train.run_files_written:TERM " + kCli + args + " --steps 10");
  EXPECT_EQ(stopped.exit_code, 128 + SIGTERM) << stopped.output;
  EXPECT_TRUE(contains(stopped.output, "stopped by SIGTERM after step 1; saved in " + dir + "/run/checkpoints"))
      << stopped.output;
  const auto resumed = run_command(kCli + args + " --steps 3");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from " + dir + "/run/checkpoints/step_00000001")) << resumed.output;
  fs::remove_all(dir);
}

TEST(NewUser, CtrlCWithoutSaveEverySavesIntoTheRunFolderAndTheFolderResumes) {
  const auto dir = make_temp_dir();
  BackgroundCommand job(kCli + " train --model gpt2-tiny --data synthetic --seq-len 16 --batch-size 2 --steps 100000 " +
                            "--log-every 1 --out-dir " + dir + "/run",
                        dir + "/job.log");
  for (int i = 0; i < 600 && train_losses(read_metrics(dir + "/run/metrics.jsonl")).size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(job.pid(), SIGINT);
  EXPECT_EQ(job.wait(std::chrono::seconds(60)), 130) << job.output();
  EXPECT_TRUE(contains(job.output(), "; saved in " + dir + "/run/checkpoints; resume with --out-dir " + dir + "/run\n"))
      << job.output();
  const std::string latest = read_file(dir + "/run/checkpoints/latest");
  ASSERT_FALSE(latest.empty()) << job.output();
  const int saved = std::stoi(latest.substr(latest.find('_') + 1));
  const auto resumed = train("--data synthetic --steps " + std::to_string(saved + 2) + " --out-dir " + dir + "/run");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from " + dir + "/run/checkpoints/step_")) << resumed.output;
  fs::remove_all(dir);
}

TEST(NewUser, AStopBeforeTheExportLeavesNoEmptyExportFolder) {
  const auto dir = make_temp_dir();
  BackgroundCommand job(kCli + " train --model gpt2-tiny --data synthetic --seq-len 16 --batch-size 2 --steps 100000 " +
                            "--log-every 1 --out-dir " + dir + "/run --export-hf " + dir + "/exports/hf",
                        dir + "/job.log");
  for (int i = 0; i < 600 && train_losses(read_metrics(dir + "/run/metrics.jsonl")).size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(job.pid(), SIGINT);
  EXPECT_EQ(job.wait(std::chrono::seconds(60)), 130) << job.output();
  EXPECT_TRUE(contains(job.output(), "stopped by SIGINT")) << job.output();
  EXPECT_FALSE(fs::exists(dir + "/exports")) << "an empty export folder stayed after the stop";
  fs::remove_all(dir);
}

TEST(NewUser, TheRankLogHoldsTheStartTheTerminalShowed) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  const std::string run = " --data " + corpus + " --out-dir " + dir + "/run --save-every 2";
  ASSERT_EQ(train("--steps 2 --lr 1e-3" + run).exit_code, 0);
  const auto resumed = train("--steps 4 --lr 2e-3" + run);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::string log = read_file(dir + "/run/logs/rank0.log");
  for (const char* line : {"model gpt2-tiny: ", "data: ", "resumed from ", "note: this run's configuration differs",
                           "optim.lr: 0.001 -> 0.002", "run folder: "}) {
    EXPECT_TRUE(contains(log, line)) << line << " missing from rank0.log:\n" << log;
    EXPECT_TRUE(contains(resumed.output, line)) << line << " missing from the terminal:\n" << resumed.output;
  }
  // The resumed start's lines follow its marker.
  const auto marker = log.find("--- resumed at step 2 ---");
  ASSERT_NE(marker, std::string::npos) << log;
  EXPECT_GT(log.rfind("model gpt2-tiny: "), marker) << log;
  EXPECT_GT(log.find("note: this run's configuration differs"), marker) << log;
  fs::remove_all(dir);
}

TEST(NewUser, ADamagedLatestNamesTheIntactCheckpointsAndResumeFromPicksOne) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  const std::string run = " --data " + corpus + " --ckpt-dir " + dir + "/ckpt --save-every 2 --keep 3 --out-dir " + dir;
  ASSERT_EQ(train("--steps 6" + run).exit_code, 0);
  // Damage the newest checkpoint's shard file: its checksum no longer holds.
  const std::string shard = dir + "/ckpt/step_00000006/rank_00000.safetensors";
  ASSERT_TRUE(fs::exists(shard));
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard) - 8));
    f.write("XXXXXXXX", 8);
  }
  const auto damaged = train("--steps 8" + run);
  EXPECT_NE(damaged.exit_code, 0);
  EXPECT_TRUE(contains(damaged.output, "intact: step_00000002, step_00000004 (resume from one with --resume-from STEP)"))
      << damaged.output;
  const auto missing = train("--steps 8 --resume-from 5" + run);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_TRUE(contains(missing.output, "--resume-from 5: '" + dir + "/ckpt' holds no checkpoint of that step"))
      << missing.output;
  const auto older = train("--steps 8 --resume-from 4" + run);
  ASSERT_EQ(older.exit_code, 0) << older.output;
  EXPECT_TRUE(contains(older.output, "resumed from " + dir + "/ckpt/step_00000004 at step 4")) << older.output;
  // The damaged step 6 of the run being redone is out of pruning's and
  // `latest`'s way; the new steps 6 and 8 are the newest.
  EXPECT_TRUE(fs::is_directory(dir + "/ckpt/superseded-step_00000006")) << older.output;
  EXPECT_TRUE(fs::is_directory(dir + "/ckpt/step_00000006")) << older.output;
  EXPECT_EQ(read_file(dir + "/ckpt/latest"), "step_00000008\n");
  // --resume-from says where this run started: no setting of the next one.
  EXPECT_TRUE(contains(read_file(dir + "/config.yaml"), "resume_from: 0")) << read_file(dir + "/config.yaml");
  // The same again: the first set aside keeps its name, the second takes the next.
  const auto again = train("--steps 8 --resume-from 4" + run);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "step_00000006 renamed superseded-2-step_00000006")) << again.output;
  EXPECT_TRUE(fs::is_directory(dir + "/ckpt/superseded-step_00000006"));
  EXPECT_TRUE(fs::is_directory(dir + "/ckpt/superseded-2-step_00000006"));
  EXPECT_TRUE(fs::is_directory(dir + "/ckpt/superseded-step_00000008"));
  EXPECT_EQ(read_file(dir + "/ckpt/latest"), "step_00000008\n");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fsdp::testing::new_user_test
