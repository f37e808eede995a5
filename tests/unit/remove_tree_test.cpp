// io::remove_tree, which stands in for std::filesystem::remove_all (see
// [Note: no std::filesystem::remove_all]): the same result, checked with
// the file system's own view.

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "fsdp/common/error.h"
#include "fsdp/io/remove_tree.h"

namespace fsdp::io {
namespace {

namespace fs = std::filesystem;

std::string temp_dir() {
  std::string pattern = (fs::temp_directory_path() / "fsdp-remove-tree-XXXXXX").string();
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

void touch(const std::string& path) { std::ofstream(path) << "x"; }

TEST(RemoveTree, RemovesANestedTreeAndCountsItsEntries) {
  const auto root = temp_dir();
  const auto tree = root + "/tree";
  fs::create_directories(tree + "/a/b/c");
  fs::create_directories(tree + "/empty");
  touch(tree + "/top.bin");
  touch(tree + "/a/one");
  touch(tree + "/a/b/two");
  touch(tree + "/a/b/c/three");
  std::error_code ec;
  // tree, a, b, c, empty and four files.
  EXPECT_EQ(remove_tree(tree, ec), 9u);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(fs::exists(tree));
  EXPECT_TRUE(fs::is_directory(root));
  fs::remove(root);
}

TEST(RemoveTree, RemovesALinkButNotWhatItPointsTo) {
  const auto root = temp_dir();
  fs::create_directories(root + "/kept");
  touch(root + "/kept/file");
  fs::create_directories(root + "/tree");
  fs::create_directory_symlink(root + "/kept", root + "/tree/link");
  EXPECT_EQ(remove_tree(root + "/tree"), 2u);
  EXPECT_FALSE(fs::exists(root + "/tree"));
  EXPECT_TRUE(fs::exists(root + "/kept/file"));
  EXPECT_EQ(remove_tree(root), 3u);
}

TEST(RemoveTree, AFileOrAMissingPathIsFine) {
  const auto root = temp_dir();
  touch(root + "/file");
  EXPECT_EQ(remove_tree(root + "/file"), 1u);
  EXPECT_FALSE(fs::exists(root + "/file"));
  std::error_code ec;
  EXPECT_EQ(remove_tree(root + "/missing", ec), 0u);
  EXPECT_FALSE(ec);
  EXPECT_EQ(remove_tree(root), 1u);
}

TEST(RemoveTree, AFailureNamesThePathAndTheReason) {
  if (::geteuid() == 0) GTEST_SKIP() << "root may remove anything: no permission error to provoke";
  const auto root = temp_dir();
  fs::create_directories(root + "/locked/inner");
  ASSERT_EQ(::chmod((root + "/locked").c_str(), 0500), 0);
  std::error_code ec;
  EXPECT_EQ(remove_tree(root + "/locked", ec), UINTMAX_MAX);
  EXPECT_EQ(ec, std::errc::permission_denied);
  try {
    remove_tree(root + "/locked");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(root + "/locked"), std::string::npos) << e.what();
  }
  ::chmod((root + "/locked").c_str(), 0700);
  remove_tree(root);
}

}  // namespace
}  // namespace fsdp::io
