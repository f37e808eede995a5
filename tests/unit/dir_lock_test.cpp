// One job per folder, one job per appended file: a second lock on a file a
// live holder has is refused by name, the lock goes with its holder, and a
// symbolic link is never followed.

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "fsdp/common/error.h"
#include "fsdp/io/dir_lock.h"

namespace fsdp::io {
namespace {

std::string temp_dir() {
  char pattern[] = "/tmp/fsdp_dir_lock_test_XXXXXX";
  const char* made = ::mkdtemp(pattern);
  EXPECT_NE(made, nullptr);
  return made == nullptr ? "" : made;
}

TEST(FileLock, ASecondHolderIsRefusedUntilTheFirstLetsGo) {
  const auto dir = temp_dir();
  const std::string path = dir + "/m.jsonl";
  {
    std::ofstream(path) << "{\"step\": 1}\n";
    FileLock first(path, "--metrics");
    try {
      FileLock second(path, "--metrics");
      ADD_FAILURE() << "a second lock on a held file was granted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--metrics '" + path + "' is being written by another live job"),
                std::string::npos)
          << e.what();
    }
  }
  FileLock again(path, "--metrics");  // the first is gone: free
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "{\"step\": 1}") << "locking wrote to the file";
  std::filesystem::remove_all(dir);
}

TEST(FileLock, ASymbolicLinkIsRefused) {
  const auto dir = temp_dir();
  std::ofstream(dir + "/elsewhere") << "theirs\n";
  std::filesystem::create_symlink(dir + "/elsewhere", dir + "/m.jsonl");
  EXPECT_THROW(FileLock(dir + "/m.jsonl", "--metrics"), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fsdp::io
