// One job owns a run folder ([Note: one job owns a run folder]): a second
// job into a live run's folder, or into its checkpoints, is refused naming
// the holder, and the live run's files stay where they are; the lock goes
// with the job, also when its launcher is killed, whose ranks die with it.

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "../test_paths.h"
#include "run_command.h"
#include "train_support.h"

namespace fsdp::testing::run_folder_lock_test {
namespace {

namespace fs = std::filesystem;
const std::string kCli = kCliProgram;

std::string train(const std::string& out_dir, int steps, const std::string& extra = "") {
  return kCli + " train --model gpt2-tiny --data synthetic --seq-len 16 --batch-size 2 --log-every 1 --steps " +
         std::to_string(steps) + " --out-dir " + out_dir + " " + extra;
}

// A W = 2 job training until stopped, once it has logged two steps and
// published its first checkpoint (step 2's, written after step 2's log
// line: a job killed between the two would leave nothing to resume).
// `metrics`: where its metrics go (default: its run folder's).
std::unique_ptr<BackgroundCommand> live_job(const std::string& dir, const std::string& extra = "",
                                            const std::string& metrics = "") {
  auto job = std::make_unique<BackgroundCommand>(
      kCli + " launch -n 2 -- " + train(dir + "/run", 100000, "--save-every 2 " + extra), dir + "/live.log");
  const std::string latest = dir + "/run/checkpoints/latest";
  const std::string lines = metrics.empty() ? dir + "/run/metrics.jsonl" : metrics;
  const auto started = [&] { return train_losses(read_metrics(lines)).size() >= 2 && fs::exists(latest); };
  for (int i = 0; i < 600 && !started(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(started()) << job->output();
  return job;
}

// Continues the run in `run` two steps past its latest checkpoint: it must
// take the folder (no lock left held) and resume there.
void expect_it_continues(const std::string& run) {
  const std::string latest = read_file(run + "/checkpoints/latest");
  const auto next = run_command(train(run, std::stoi(latest.substr(latest.find('_') + 1)) + 2));
  EXPECT_EQ(next.exit_code, 0) << next.output;
  EXPECT_TRUE(contains(next.output, "resumed")) << next.output;
}

// Whether `pid` has ended (gone, or a zombie nobody reaped yet).
bool ended(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const auto close = line.rfind(')');
  return close != std::string::npos && line.size() > close + 2 && line[close + 2] == 'Z';
}

TEST(RunFolderLock, ASecondJobIsRefusedNamingTheHolderAndTheLiveRunIsUntouched) {
  const auto dir = make_temp_dir();
  auto job = live_job(dir);
  const auto ranks = job->children();
  ASSERT_EQ(ranks.size(), 2u) << job->output();
  const auto config_before = read_file(dir + "/run/config.yaml");

  // Into the same folder, fresh or resuming, one process or a launched job.
  for (const auto& second : {train(dir + "/run", 2), train(dir + "/run", 2, "--resume"),
                             kCli + " launch -n 2 -- " + train(dir + "/run", 2)}) {
    const auto r = run_command(second);
    EXPECT_NE(r.exit_code, 0) << second << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "run folder '" + dir + "/run' is in use by another job (host ")) << r.output;
    EXPECT_TRUE(contains(r.output, "PID " + std::to_string(ranks[0])) ||
                contains(r.output, "PID " + std::to_string(ranks[1])))
        << "the holder named is not one of the live job's ranks\n" << r.output;
    EXPECT_TRUE(contains(r.output, "choose another --out-dir")) << r.output;
  }
  // From a folder of its own, into the live run's checkpoints.
  const auto into_ckpt = run_command(train(dir + "/other", 2, "--ckpt-dir " + dir + "/run/checkpoints"));
  EXPECT_NE(into_ckpt.exit_code, 0) << into_ckpt.output;
  EXPECT_TRUE(contains(into_ckpt.output, "checkpoint folder '" + dir + "/run/checkpoints' is in use by another job"))
      << into_ckpt.output;
  EXPECT_FALSE(exists(dir + "/other")) << "a refused start left its folder behind";
  // Any output of a run of its own inside the live job's folders: refused
  // before a byte is written there (the live job's metrics keep growing,
  // never truncated).
  const auto metrics_before = fs::file_size(dir + "/run/metrics.jsonl");
  for (const auto& [extra, flag, path] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--metrics " + dir + "/run/metrics.jsonl", "--metrics", dir + "/run/metrics.jsonl"},
           {"--export-hf " + dir + "/run/checkpoints/hf", "--export-hf", dir + "/run/checkpoints/hf"},
           {"--ckpt-dir " + dir + "/run/logs/ckpt", "--ckpt-dir", dir + "/run/logs/ckpt"}}) {
    const auto r = run_command(train(dir + "/other", 2, extra));
    EXPECT_NE(r.exit_code, 0) << extra << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, flag + " '" + path + "' lies in '")) << r.output;
    EXPECT_TRUE(contains(r.output, "the folder of another live job (host ")) << r.output;
    EXPECT_FALSE(exists(dir + "/other")) << "a refused start left its folder behind";
  }
  const auto inside_logs = run_command(train(dir + "/run/logs/nested", 2));
  EXPECT_NE(inside_logs.exit_code, 0) << inside_logs.output;
  EXPECT_TRUE(contains(inside_logs.output, "--out-dir '" + dir + "/run/logs/nested' lies in '" + dir + "/run'"))
      << inside_logs.output;
  EXPECT_FALSE(exists(dir + "/run/logs/nested"));
  EXPECT_FALSE(exists(dir + "/run/checkpoints/hf"));
  EXPECT_FALSE(exists(dir + "/run/logs/ckpt"));
  EXPECT_GE(fs::file_size(dir + "/run/metrics.jsonl"), metrics_before);

  // Nothing of the live run was moved aside, and it ends as it would have.
  EXPECT_FALSE(exists(dir + "/run/earlier-1"));
  EXPECT_EQ(read_file(dir + "/run/config.yaml"), config_before);
  ::kill(job->pid(), SIGINT);
  EXPECT_EQ(job->wait(std::chrono::seconds(120)), 130) << job->output();
  // Once it has ended, the folder is free again: the run continues there.
  expect_it_continues(dir + "/run");
  fs::remove_all(dir);
}

// --metrics naming a file another run wrote: a new run refuses it (it
// would truncate it), the run that resumes appends to it.
TEST(RunFolder, AnExistingMetricsFileIsRefusedUnlessTheRunResumes) {
  const auto dir = make_temp_dir();
  const std::string metrics = dir + "/metrics.jsonl";
  const auto first = run_command(train(dir + "/a", 2, "--save-every 2 --metrics " + metrics));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string written = read_file(metrics);
  ASSERT_EQ(train_losses(read_metrics(metrics)).size(), 2u) << written;

  const auto other = run_command(train(dir + "/b", 2, "--metrics " + metrics));
  EXPECT_NE(other.exit_code, 0) << other.output;
  EXPECT_TRUE(contains(other.output, "--metrics '" + metrics + "' exists and this run does not resume the run that "
                                     "wrote it"))
      << other.output;
  EXPECT_EQ(read_file(metrics), written) << "the refused run changed the file";
  EXPECT_FALSE(exists(dir + "/b"));

  const auto resumed = run_command(train(dir + "/a", 4, "--metrics " + metrics));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(read_file(metrics).substr(0, written.size()), written);
  EXPECT_EQ(train_losses(read_metrics(metrics)).size(), 4u) << read_file(metrics);
  fs::remove_all(dir);
}

// A resume appends only to its own run's metrics file: job B, resuming a
// run of its own, is refused another live job's --metrics (it would
// append, and the live job then write over B's lines at its old offset),
// and the live job's file keeps only its own lines. Two live jobs on one
// file are refused by the file's lock as well (io::FileLock, in
// tests/unit/dir_lock_test.cpp).
TEST(RunFolderLock, AResumeIsRefusedAnotherLiveJobsMetricsFile) {
  const auto dir = make_temp_dir();
  const std::string shared = dir + "/m.jsonl";
  const auto b_first = run_command(train(dir + "/b", 2, "--save-every 2"));
  ASSERT_EQ(b_first.exit_code, 0) << b_first.output;
  auto a = live_job(dir, "--metrics " + shared, shared);
  const auto b = run_command(train(dir + "/b", 4, "--metrics " + shared));
  EXPECT_NE(b.exit_code, 0) << b.output;
  EXPECT_TRUE(contains(b.output, "--metrics '" + shared + "' holds lines, and the run resumed here wrote its metrics "
                                 "to '" + dir + "/b/metrics.jsonl'"))
      << b.output;
  ::kill(a->pid(), SIGINT);
  EXPECT_EQ(a->wait(std::chrono::seconds(120)), 130) << a->output();
  for (const auto& line : read_metrics(shared)) {
    EXPECT_TRUE(line.value("event", "") != "resume") << "job B wrote into job A's file: " << line.dump();
  }
  // B resumes with its own file.
  const auto own = run_command(train(dir + "/b", 4));
  EXPECT_EQ(own.exit_code, 0) << own.output;
  EXPECT_EQ(train_losses(read_metrics(dir + "/b/metrics.jsonl")).size(), 4u);
  fs::remove_all(dir);
}

// `fsdp ckpt export` into a live job's run folder or its checkpoints/ is
// refused as `fsdp train --export-hf` refuses it, in every format, and the
// live job's files stay as they were.
TEST(RunFolderLock, AnExportIntoALiveJobsFoldersIsRefused) {
  const auto dir = make_temp_dir();
  auto a = live_job(dir, "--keep 100000");  // the checkpoint exported stays while the job trains on
  const std::string step = dir + "/run/checkpoints/" + read_file(dir + "/run/checkpoints/latest").substr(0, 13);
  for (const std::string& out : {dir + "/run/exported", dir + "/run/checkpoints/exported", dir + "/run"}) {
    for (const char* format : {"hf", "safetensors"}) {
      const auto r = run_command(kCli + " ckpt export --format " + format + " " + step + " " + out);
      EXPECT_NE(r.exit_code, 0) << r.output;
      EXPECT_TRUE(contains(r.output, "the export's OUT '" + out + "' lies in")) << r.output;
      EXPECT_TRUE(contains(r.output, "the folder of another live job")) << r.output;
    }
    if (out != dir + "/run") {
      EXPECT_FALSE(exists(out)) << out;
    }
  }
  // Outside the live job's folders the same export is made.
  const auto outside = run_command(kCli + " ckpt export " + step + " " + dir + "/elsewhere");
  EXPECT_EQ(outside.exit_code, 0) << outside.output;
  ::kill(a->pid(), SIGINT);
  EXPECT_EQ(a->wait(std::chrono::seconds(120)), 130) << a->output();
  fs::remove_all(dir);
}

TEST(RunFolderLock, RanksDieWithTheirKilledLauncherAndLeaveNoStaleLock) {
  const auto dir = make_temp_dir();
  auto job = live_job(dir);
  const auto ranks = job->children();
  ASSERT_EQ(ranks.size(), 2u) << job->output();
  ::kill(job->pid(), SIGKILL);
  job->wait(std::chrono::seconds(10));
  for (const int rank : ranks) {
    bool gone = false;
    for (int i = 0; i < 100 && !(gone = ended(rank)); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(gone) << "rank pid " << rank << " outlived its killed launcher";
  }
  // The kernel released the lock with its holder: the run continues there.
  expect_it_continues(dir + "/run");
  fs::remove_all(dir);
}

// Two jobs that name no folder and start in the same second choose the same
// default one: the second takes the next free name instead of failing (or,
// before the lock, writing into the first's). FSDP_RUN_STARTED makes "the
// same second" certain.
TEST(RunFolderLock, ADefaultFolderAnotherJobHoldsGivesWayToTheNextName) {
  const auto dir = make_temp_dir();
  const std::string same_second = "env --chdir=" + dir + " FSDP_RUN_STARTED=1700000000 " + kCli +
                                  " train --model gpt2-tiny --data synthetic --seq-len 16 --batch-size 2 --log-every 1";
  const std::string folder = dir + "/out/gpt2-tiny-20231114-221320";
  BackgroundCommand first(same_second + " --steps 100000", dir + "/first.log");
  for (int i = 0; i < 600 && train_losses(read_metrics(folder + "/metrics.jsonl")).size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(train_losses(read_metrics(folder + "/metrics.jsonl")).size(), 2u) << first.output();
  const auto second = run_command(same_second + " --steps 2");
  EXPECT_EQ(second.exit_code, 0) << second.output;
  EXPECT_TRUE(contains(second.output, "run folder out/gpt2-tiny-20231114-221320 is another job's (started in the same "
                                      "second); this run writes to out/gpt2-tiny-20231114-221320-2"))
      << second.output;
  EXPECT_EQ(train_losses(read_metrics(folder + "-2/metrics.jsonl")).size(), 2u);
  EXPECT_FALSE(exists(folder + "/earlier-1")) << "the first job's files were moved";
  // A folder the user named is not renamed: refused, as above.
  const auto named = run_command(same_second + " --steps 2 --out-dir out/gpt2-tiny-20231114-221320");
  EXPECT_NE(named.exit_code, 0) << named.output;
  EXPECT_TRUE(contains(named.output, "is in use by another job")) << named.output;
  ::kill(first.pid(), SIGINT);
  EXPECT_EQ(first.wait(std::chrono::seconds(60)), 130) << first.output();
  fs::remove_all(dir);
}

// A resumed run appends to its metrics and log: links planted in its
// folder would have it write wherever they point.
TEST(RunFolder, ResumeRefusesToWriteThroughASymbolicLink) {
  const auto dir = make_temp_dir();
  ASSERT_EQ(run_command(train(dir + "/run", 2, "--save-every 2")).exit_code, 0);
  // Files and folders alike: a folder linked elsewhere would take the
  // appended log and TensorBoard events there too.
  for (const std::string file : {"metrics.jsonl", "logs/rank0.log", "logs", "tensorboard", "checkpoints"}) {
    std::string victim = dir + "/victim-" + file;
    std::replace(victim.begin() + static_cast<std::ptrdiff_t>(dir.size()), victim.end(), '/', '_');
    const std::string path = dir + "/run/" + file;
    const bool folder = fs::is_directory(path);
    if (folder) {
      fs::copy(path, victim, fs::copy_options::recursive);
    } else {
      std::ofstream(victim) << "untouched\n";
    }
    const auto listing = [&] {
      std::string names;
      for (const auto& e : fs::recursive_directory_iterator(victim)) {
        names += e.path().string() + " " + std::to_string(e.is_regular_file() ? fs::file_size(e.path()) : 0) + "\n";
      }
      return names;
    };
    const std::string before = folder ? listing() : "";
    fs::rename(path, path + ".real");
    fs::create_symlink(victim, path);
    const auto r = run_command(train(dir + "/run", 4));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "'" + path + "' is a symbolic link")) << file << "\n" << r.output;
    if (folder) {
      EXPECT_EQ(listing(), before) << file << ": written through the link";
    } else {
      EXPECT_EQ(read_file(victim), "untouched\n");
    }
    fs::remove(path);
    fs::rename(path + ".real", path);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fsdp::testing::run_folder_lock_test
