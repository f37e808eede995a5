#include "fsdp/data/token_file.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "fsdp/common/error.h"

namespace fsdp::data {
namespace {

std::string temp_path(const std::string& name) { return "/tmp/fsdp-tokens-" + std::to_string(::getpid()) + "-" + name; }

void write_raw(const std::string& path, const std::vector<int32_t>& header, const std::vector<uint16_t>& body) {
  std::ofstream out(path, std::ios::binary);
  std::vector<int32_t> h(256, 0);
  std::copy(header.begin(), header.end(), h.begin());
  out.write(reinterpret_cast<const char*>(h.data()), 1024);
  out.write(reinterpret_cast<const char*>(body.data()), static_cast<std::streamsize>(body.size() * 2));
}

void expect_error(const std::string& path, const std::string& needle) {
  try {
    TokenFile f(path);
    ADD_FAILURE() << "expected an error for " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << "the message names the file";
  }
}

TEST(TokenFile, RoundTripNarrowAndWide) {
  const auto narrow = temp_path("narrow.bin");
  write_token_file(narrow, {5, 0, 65535, 7});
  TokenFile a(narrow);
  EXPECT_EQ(a.size(), 4);
  EXPECT_EQ(a.token(2), 65535);
  const auto wide = temp_path("wide.bin");
  write_token_file(wide, {1, 70000, 3});
  TokenFile b(wide);
  EXPECT_EQ(b.token(1), 70000);
  int64_t out[5];
  b.read(2, 5, out);  // wraps at the end
  EXPECT_EQ(std::vector<int64_t>(out, out + 5), (std::vector<int64_t>{3, 1, 70000, 3, 1}));
  EXPECT_EQ(b.max_token(), (std::pair<int64_t, int64_t>{70000, 1}));
}

TEST(TokenFile, ReadsFilesWrittenByHand) {
  // The layout llm.c's scripts write: magic, version 1, count, then uint16.
  const auto path = temp_path("llmc.bin");
  write_raw(path, {20240520, 1, 3}, {10, 20, 30});
  TokenFile f(path);
  EXPECT_EQ(f.size(), 3);
  EXPECT_EQ(f.token(0), 10);
  EXPECT_EQ(f.token(2), 30);
}

// The bytes llm.c's writer (dev/data/data_common.py) produces: 256 int32
// header values [magic, version, count, 0...], then the tokens.
std::string llmc_bytes(int32_t magic, int32_t version, const std::vector<uint32_t>& tokens, int width) {
  std::string bytes(1024, '\0');
  const int32_t head[3] = {magic, version, static_cast<int32_t>(tokens.size())};
  std::memcpy(bytes.data(), head, sizeof(head));
  for (uint32_t t : tokens) bytes.append(reinterpret_cast<const char*>(&t), static_cast<size_t>(width));  // little-endian
  return bytes;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(TokenFile, Llama3FilesAsLlmcWritesThem) {
  // Llama 3's vocabulary (128256) needs uint32: magic 20240801, version 7.
  const auto path = temp_path("llama3.bin");
  std::ofstream(path, std::ios::binary) << llmc_bytes(20240801, 7, {128000, 9906, 1917, 128255}, 4);
  TokenFile f(path);
  EXPECT_EQ(f.size(), 4);
  EXPECT_EQ(f.token(0), 128000);
  EXPECT_EQ(f.token(3), 128255);
  // And what we write is byte for byte what llm.c writes, for both vocabularies.
  const auto ours = temp_path("ours-llama3.bin");
  write_token_file(ours, {128000, 9906, 1917, 128255}, 128256);
  EXPECT_EQ(file_bytes(ours), llmc_bytes(20240801, 7, {128000, 9906, 1917, 128255}, 4));
  const auto gpt2 = temp_path("ours-gpt2.bin");
  write_token_file(gpt2, {50256, 15496, 995}, 50257);
  EXPECT_EQ(file_bytes(gpt2), llmc_bytes(20240520, 1, {50256, 15496, 995}, 2));
  // A small id in a large vocabulary still gets the wide header.
  const auto small_ids = temp_path("small-ids.bin");
  write_token_file(small_ids, {1, 2, 3}, 128256);
  EXPECT_EQ(file_bytes(small_ids), llmc_bytes(20240801, 7, {1, 2, 3}, 4));
  const auto wrong_version = temp_path("wrong-version.bin");
  std::ofstream(wrong_version, std::ios::binary) << llmc_bytes(20240801, 1, {1, 2}, 4);
  expect_error(wrong_version, "expected version 7");
}

TEST(TokenFile, BadInput) {
  const auto bad_magic = temp_path("magic.bin");
  write_raw(bad_magic, {12345, 1, 3}, {1, 2, 3});
  expect_error(bad_magic, "has magic 12345, expected 20240520 (llm.c, GPT-2 tokens) or 20240801");
  const auto truncated = temp_path("truncated.bin");
  write_raw(truncated, {20240520, 1, 100}, {1, 2, 3});
  expect_error(truncated, "truncated: its header promises 100 tokens but the body holds 3");
  const auto version = temp_path("version.bin");
  write_raw(version, {20240520, 7, 3}, {1, 2, 3});
  expect_error(version, "version 7");
  const auto tiny = temp_path("tiny.bin");
  std::ofstream(tiny) << "short";
  expect_error(tiny, "shorter than the 1024-byte header");
  expect_error(temp_path("missing.bin"), "cannot open");
  // Bytes past the tokens the header promises: a damaged file, or 4-byte
  // ids under a 2-byte header (each id read as two, the high half 0).
  const auto trailing = temp_path("trailing.bin");
  write_raw(trailing, {20240520, 1, 3}, {1, 2, 3, 4});
  expect_error(trailing, "holds 2 bytes after the 3 tokens of 2 bytes its header promises");
  const auto wide_body = temp_path("wide-body.bin");
  write_raw(wide_body, {20240520, 1, 3}, {1, 0, 2, 0, 3, 0});
  expect_error(wide_body, "holds 6 bytes after the 3 tokens of 2 bytes");
}

}  // namespace
}  // namespace fsdp::data
