// io::read_streamed: every byte of the file reaches the callback once, in
// order, in blocks that tile it, and the CRC-32 returned is the file's
// (CRC-32's published check value, and zlib's over the whole file in one
// call), on a disk (O_DIRECT) and on tmpfs (buffered), whatever the size
// against the 4 KiB alignment and the 8 MiB blocks.

#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fsdp/common/error.h"
#include "fsdp/io/streamed_read.h"

namespace fsdp::io {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const fs::path& under) {
  std::string pattern = (under / "fsdp-streamed-read-XXXXXX").string();
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

void write_file(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void expect_every_byte(const fs::path& under) {
  if (!fs::is_directory(under)) GTEST_SKIP() << under << " is not here";
  const auto dir = temp_dir(under);
  constexpr size_t kMiB = size_t{1} << 20;
  for (const size_t size : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, 8 * kMiB, 8 * kMiB + 1,
                            40 * kMiB + 123}) {
    std::mt19937 gen(static_cast<unsigned>(size));
    std::vector<char> bytes(size);
    for (auto& c : bytes) c = static_cast<char>(gen());
    const std::string path = dir + "/f" + std::to_string(size);
    write_file(path, bytes);
    std::vector<char> seen;
    uint64_t next = 0;
    const uint32_t crc = read_streamed(path, [&](uint64_t offset, const char* data, size_t n) {
      EXPECT_EQ(offset, next) << path << ": blocks out of order";
      next = offset + n;
      seen.insert(seen.end(), data, data + n);
    });
    EXPECT_TRUE(seen == bytes) << path << ": the bytes seen differ from the file's";
    const auto whole = static_cast<uint32_t>(
        ::crc32(::crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(size)));
    EXPECT_EQ(crc, whole) << path;
  }
  write_file(dir + "/check", {'1', '2', '3', '4', '5', '6', '7', '8', '9'});
  EXPECT_EQ(read_streamed(dir + "/check", {}), 0xCBF43926u) << "CRC-32's check value of \"123456789\"";
  fs::remove_all(dir);
}

TEST(StreamedRead, OnADiskEveryByteArrivesOnceInOrderWithTheFilesCrc) {
  expect_every_byte(fs::current_path());  // the build tree
}
TEST(StreamedRead, OnTmpfsEveryByteArrivesOnceInOrderWithTheFilesCrc) { expect_every_byte("/dev/shm"); }

TEST(StreamedRead, AMissingFileIsNamed) {
  try {
    read_streamed("/nonexistent/rank_00000.safetensors", {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/rank_00000.safetensors"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fsdp::io
