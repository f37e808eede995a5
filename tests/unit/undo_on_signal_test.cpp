// io::UndoOnSignal: a process that SIGTERM or SIGINT ends while one lives
// removes the registered files and empty directories, and still dies of
// that signal. Each case ends a child (a death test); the parent then
// reads the file system.

#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "fsdp/io/remove_tree.h"
#include "fsdp/io/undo_on_signal.h"

namespace fsdp::io {
namespace {

namespace fs = std::filesystem;

// base/made/run/checkpoints, with a lock file in run: what a start makes
// when base/made was missing.
struct StartTree {
  std::string base, made, run, checkpoints, lock;
  StartTree() {
    std::string pattern = (fs::temp_directory_path() / "fsdp-undo-XXXXXX").string();
    EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
    base = pattern;
    made = base + "/made";
    run = made + "/run";
    checkpoints = run + "/checkpoints";
    lock = run + "/.lock";
  }
  ~StartTree() {
    std::error_code ec;
    remove_tree(base, ec);
  }
  void create() const {
    fs::create_directories(checkpoints);
    std::ofstream(lock) << "host h, PID 1";
  }
};

TEST(UndoOnSignal, ASignalRemovesWhatTheStartMadeAndStillEndsTheProcess) {
  StartTree t;
  for (const int sig : {SIGTERM, SIGINT}) {
    EXPECT_EXIT(
        {
          UndoOnSignal undo;
          undo.remove_file(t.lock);
          undo.remove_empty_dirs(t.run, t.made);
          undo.remove_empty_dirs(t.checkpoints + "/", t.made);  // listed after its parent, with a trailing '/'
          t.create();
          ::raise(sig);
          std::exit(0);
        },
        ::testing::KilledBySignal(sig), "");
    EXPECT_FALSE(fs::exists(t.made)) << "signal " << sig;
    EXPECT_TRUE(fs::is_directory(t.base)) << "the folder that was there before went too";
  }
}

TEST(UndoOnSignal, ADirectoryThatHoldsAFileStays) {
  StartTree t;
  EXPECT_EXIT(
      {
        UndoOnSignal undo;
        undo.remove_file(t.lock);
        undo.remove_empty_dirs(t.checkpoints, t.made);
        t.create();
        std::ofstream(t.run + "/metrics.jsonl") << "{}\n";
        ::raise(SIGTERM);
      },
      ::testing::KilledBySignal(SIGTERM), "");
  EXPECT_FALSE(fs::exists(t.lock));
  EXPECT_FALSE(fs::exists(t.checkpoints));
  EXPECT_TRUE(fs::exists(t.run + "/metrics.jsonl"));
}

TEST(UndoOnSignal, NothingGoesOnceItIsDestroyedOrOutsideTheTopGiven) {
  StartTree t;
  EXPECT_EXIT(
      {
        {
          UndoOnSignal undo;
          undo.remove_empty_dirs(t.checkpoints, t.made);
        }
        t.create();
        ::raise(SIGTERM);
      },
      ::testing::KilledBySignal(SIGTERM), "");
  EXPECT_TRUE(fs::exists(t.checkpoints)) << "a destroyed UndoOnSignal still removed its paths";
  EXPECT_EXIT(
      {
        UndoOnSignal undo;
        undo.remove_empty_dirs(t.checkpoints, t.base + "/elsewhere");
        undo.remove_empty_dirs(t.checkpoints, "");
        ::raise(SIGTERM);
      },
      ::testing::KilledBySignal(SIGTERM), "");
  EXPECT_TRUE(fs::exists(t.checkpoints)) << "a directory outside the top given, or with none, was removed";
}

}  // namespace
}  // namespace fsdp::io
