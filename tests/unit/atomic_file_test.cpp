// io::AtomicFile: the bytes written come back as written, in both modes and
// on a disk (O_DIRECT, [Note: checkpoint writes past the page cache]) and
// on tmpfs (which refuses it), whatever the sizes against the 4 KiB
// alignment and the 8 MiB staging buffers; and a file never committed
// leaves nothing behind.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fsdp/io/atomic_file.h"

namespace fsdp::io {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const fs::path& under) {
  std::string pattern = (under / "fsdp-atomic-file-XXXXXX").string();
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

std::vector<char> random_bytes(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<char> out(n);
  for (auto& c : out) c = static_cast<char>(gen());
  return out;
}

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void expect_round_trip(const fs::path& under, AtomicFile::Mode mode) {
  if (!fs::is_directory(under)) GTEST_SKIP() << under << " is not here";
  const auto dir = temp_dir(under);
  constexpr size_t kMiB = size_t{1} << 20;
  const std::vector<size_t> sizes = {0, 1, 4095, 4096, 4097, 8 * kMiB, 8 * kMiB + 1, 20 * kMiB + 123};
  for (const size_t size : sizes) {
    const auto bytes = random_bytes(size, static_cast<unsigned>(size));
    const std::string path = dir + "/f" + std::to_string(size);
    {
      AtomicFile file(path, mode);
      // In uneven pieces, some larger than a staging buffer.
      size_t done = 0, piece = 1000;
      while (done < size) {
        const size_t n = std::min(piece, size - done);
        file.write(bytes.data() + done, n);
        done += n;
        piece = piece * 7 + 3;
      }
      file.commit();
    }
    EXPECT_EQ(fs::file_size(path), size) << path;
    EXPECT_TRUE(read_all(path) == bytes) << path << ": the bytes read back differ";
  }
  {
    AtomicFile abandoned(dir + "/abandoned", mode);
    abandoned.write(std::string(5000, 'x'));
  }
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left.size(), sizes.size()) << "a file never committed left something behind";
  fs::remove_all(dir);
}

TEST(AtomicFile, StreamedOnADiskWritesEveryByte) {
  expect_round_trip(fs::current_path(), AtomicFile::Mode::kStreamed);  // the build tree
}
TEST(AtomicFile, StreamedOnTmpfsFallsBackAndWritesEveryByte) {
  expect_round_trip("/dev/shm", AtomicFile::Mode::kStreamed);
}
TEST(AtomicFile, BufferedWritesEveryByte) {
  expect_round_trip(fs::temp_directory_path(), AtomicFile::Mode::kBuffered);
}

}  // namespace
}  // namespace fsdp::io
