// safetensors files that lie: every problem is an error naming the file and
// the tensor, never a crash or a silent load. The bad files are made here.

#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/io/safetensors.h"

namespace fsdp::io::safetensors_test {
namespace {

std::string temp_path(const std::string& name) {
  return "/tmp/fsdp-st-" + std::to_string(::getpid()) + "-" + name + ".safetensors";
}

// A file with `header` as its JSON header and `data_bytes` zero bytes of data.
std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes, int64_t claimed_len = -1) {
  const auto path = temp_path(name);
  std::ofstream out(path, std::ios::binary);
  const uint64_t len = claimed_len >= 0 ? static_cast<uint64_t>(claimed_len) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\0');
  return path;
}

void expect_error(const std::string& path, const std::vector<std::string>& needles) {
  try {
    SafetensorsFile f(path);
    ADD_FAILURE() << "expected an error for " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RoundTripWithMetadata) {
  const auto path = temp_path("ok");
  auto a = torch::arange(6, torch::kFloat).view({2, 3});
  auto b = torch::tensor({1, 2, 3}, torch::kLong);
  auto c = torch::randn({4}).to(torch::kBFloat16);
  write_safetensors(path, {{"a", a}, {"b", b}, {"c", c}}, {{"format", "pt"}});
  SafetensorsFile f(path);
  EXPECT_TRUE(f.view("a").equal(a));
  EXPECT_TRUE(f.view("b").equal(b));
  EXPECT_TRUE(f.view("c").equal(c));
  EXPECT_TRUE(f.read_range("a", 2, 3).equal(torch::tensor({2.0f, 3.0f, 4.0f})));
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

TEST(Safetensors, LyingHeaders) {
  const auto entry = [](const std::string& dtype, const std::string& shape, uint64_t begin, uint64_t end) {
    return "{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(begin) + "," +
           std::to_string(end) + "]}";
  };
  expect_error(write_raw("out_of_file", "{\"w\":" + entry("F32", "[4]", 0, 16) + "}", 8),
               {"tensor 'w'", "outside the 8-byte data section"});
  expect_error(write_raw("overlap", "{\"a\":" + entry("F32", "[2]", 0, 8) + ",\"b\":" + entry("F32", "[2]", 4, 12) + "}", 12),
               {"'a' and 'b' overlap"});
  expect_error(write_raw("size_mismatch", "{\"w\":" + entry("F32", "[3]", 0, 8) + "}", 8),
               {"holds 8 bytes but shape and dtype need 12"});
  expect_error(write_raw("absurd", "{\"w\":" + entry("F32", "[4611686018427387904,4]", 0, 8) + "}", 8),
               {"shape [4611686018427387904, 4] of F32 needs 2^64 bytes or more; the data section holds 8"});
  // 2^62 floats are 2^64 bytes: a product that wraps to 0 and so matched the
  // empty offsets, after which a view read far outside the mapping.
  expect_error(write_raw("wraps_to_zero", "{\"w\":" + entry("F32", "[4611686018427387904]", 0, 0) + "}", 8),
               {"tensor 'w'", "needs 2^64 bytes or more"});
  expect_error(write_raw("wraps_in_3d", "{\"w\":" + entry("I8", "[4294967296,4294967296,1]", 0, 0) + "}", 8),
               {"needs 2^64 bytes or more"});
  expect_error(write_raw("past_int64", "{\"w\":" + entry("I8", "[9223372036854775808]", 0, 0) + "}", 8),
               {"larger than a tensor can have"});
  expect_error(write_raw("bad_dtype", "{\"w\":" + entry("Q4", "[2]", 0, 8) + "}", 8), {"unknown dtype 'Q4'"});
  expect_error(write_raw("header_len", "{}", 0, 1 << 20), {"header length 1048576 does not fit"});
  expect_error(write_raw("not_json", "{not json", 0), {"not valid JSON"});
  expect_error(write_raw("negative", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4),
               {"negative dimension"});
}

TEST(Safetensors, AnEmptyTensorMayHaveAHugeDimension) {
  // Zero elements whatever the other dimensions: valid, as in PyTorch.
  const auto path =
      write_raw("empty_huge", R"({"w":{"dtype":"F32","shape":[4611686018427387904,0],"data_offsets":[0,0]}})", 8);
  SafetensorsFile f(path);
  EXPECT_EQ(f.view("w").numel(), 0);
  EXPECT_THROW(f.read_range("w", 0, 1), Error);
}

TEST(Safetensors, AHeaderThatEndsTheFileExactlyOpens) {
  // A file of only empty tensors has no data section: the header's last byte
  // is the file's. One byte more claimed is one byte past the end.
  const std::string header = R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})";
  SafetensorsFile f(write_raw("exact_fit", header, 0));
  EXPECT_EQ(f.view("w").numel(), 0);
  expect_error(write_raw("one_past", header, 0, static_cast<int64_t>(header.size()) + 1),
               {"header length " + std::to_string(header.size() + 1) + " does not fit"});
  // Past the format's 100 MiB limit is named as that, not as not fitting.
  expect_error(write_raw("past_limit", header, 0, (100 << 20) + 1), {"past the format's limit of 104857600 bytes"});
}

TEST(Safetensors, TensorBytesNeverWrap) {
  EXPECT_EQ(tensor_bytes({2, 3}, at::kFloat), 24u);
  EXPECT_EQ(tensor_bytes({}, at::kDouble), 8u);
  EXPECT_EQ(tensor_bytes({int64_t{1} << 62, 0}, at::kFloat), 0u);
  EXPECT_FALSE(tensor_bytes({int64_t{1} << 62}, at::kFloat).has_value());
  EXPECT_FALSE(tensor_bytes({int64_t{1} << 32, int64_t{1} << 32}, at::kByte).has_value());
  EXPECT_FALSE(tensor_bytes({-1}, at::kFloat).has_value());
}

TEST(Safetensors, TruncatedAndBitFlippedFiles) {
  const auto path = temp_path("good");
  write_safetensors(path, {{"w", torch::randn({64})}});
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto truncated = temp_path("truncated");
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() - 10);
  expect_error(truncated, {"outside"});
  // Flip a digit of the end offset in the header: the sizes stop adding up.
  std::string flipped = bytes;
  const auto pos = flipped.find("256]");
  ASSERT_NE(pos, std::string::npos);
  flipped[pos] = '9';
  const auto flipped_path = temp_path("flipped");
  std::ofstream(flipped_path, std::ios::binary) << flipped;
  expect_error(flipped_path, {"tensor 'w'"});
  const auto tiny = temp_path("tiny");
  std::ofstream(tiny) << "abc";
  expect_error(tiny, {"shorter than the 8-byte header length"});
}

}  // namespace
}  // namespace fsdp::io::safetensors_test
