#include "fsdp/data/token_file.h"

#include <fstream>

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

TEST(TokenFile, BadInput) {
  const auto bad_magic = temp_path("magic.bin");
  write_raw(bad_magic, {12345, 1, 3}, {1, 2, 3});
  expect_error(bad_magic, "has magic 12345, expected 20240520");
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
}

}  // namespace
}  // namespace fsdp::data
