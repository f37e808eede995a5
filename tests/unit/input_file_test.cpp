// io::input_file: the files a user hands us are opened only when regular
// (a FIFO never blocks us), and JSON nested past any real file's depth is
// refused before a recursive reader sees it. The hostile inputs are made here
// and the readers that take them (token files, configs, tokenizers) named.

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_paths.h"
#include "fsdp/common/error.h"
#include "fsdp/data/token_file.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/io/input_file.h"
#include "fsdp/train/config.h"

namespace fsdp::io {
namespace {

namespace fs = std::filesystem;

std::string temp_dir() {
  std::string pattern = (fs::temp_directory_path() / "fsdp-input-file-XXXXXX").string();
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

// Runs `f`, which must throw fsdp::Error containing every needle, within
// 10 s: a reader blocked on a FIFO fails the test instead of hanging it.
template <class F>
void expect_refused_promptly(F f, const std::vector<std::string>& needles) {
  auto done = std::async(std::launch::async, [f]() -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  });
  ASSERT_EQ(done.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "blocked";
  const std::string what = done.get();
  ASSERT_FALSE(what.empty()) << "accepted";
  for (const auto& n : needles) EXPECT_NE(what.find(n), std::string::npos) << what;
}

// JSON with `depth` arrays nested inside each other.
std::string nested_arrays(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(InputFile, AFifoIsRefusedWithoutBlockingByEveryReader) {
  const auto dir = temp_dir();
  const auto fifo = dir + "/model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_refused_promptly([&] { open_regular_file(fifo, "weights"); }, {"weights '" + fifo + "' is a FIFO",
                                                                        "expected a regular file"});
  expect_refused_promptly([&] { data::TokenFile t(fifo); }, {"token file", "is a FIFO"});
  expect_refused_promptly([&] { train::TrainConfig c; c.load_yaml(fifo); }, {"--config file", "is a FIFO"});
  expect_refused_promptly([&] { read_json_file(fifo, "config"); }, {"is a FIFO"});
  expect_refused_promptly([&] { check_regular_file(dir, "--data"); }, {"is a directory"});
  expect_refused_promptly([&] { read_file(dir + "/missing", "--data"); }, {"cannot open --data", "No such file"});
  fs::remove_all(dir);
}

TEST(InputFile, ARegularFileAndASymlinkToOneAreRead) {
  const auto dir = temp_dir();
  std::ofstream(dir + "/a.json") << R"({"x": [1, [2, [3]]], "s": "[[[[ in a string ]]]] \" ["})";
  fs::create_symlink(dir + "/a.json", dir + "/link.json");
  const auto j = read_json_file(dir + "/link.json", "config");
  EXPECT_EQ(j["x"][1][1][0], 3);
  EXPECT_EQ(j["s"], "[[[[ in a string ]]]] \" [");
  fs::remove_all(dir);
}

// A sparse 4 TB config.json is refused by its size, before a byte is read
// (reading it whole exhausted memory, then failed inside LibTorch).
TEST(InputFile, AFileOfTerabytesIsRefusedByItsSizeUnread) {
  const auto dir = temp_dir();
  const std::string path = dir + "/config.json";
  std::ofstream(path) << "{}";
  fs::resize_file(path, int64_t{4} << 40);  // sparse: no disk used
  const auto start = std::chrono::steady_clock::now();
  try {
    read_json_file(path, "Hugging Face config");
    ADD_FAILURE() << "a 4 TB config.json was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Hugging Face config '" + path + "' is 4398046511104 bytes; no such file "
                                         "is larger than 1024 MiB"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  fs::remove_all(dir);
}

TEST(InputFile, NestingIsBoundedAtSixtyFourLevels) {
  EXPECT_EQ(parse_json(nested_arrays(kMaxJsonDepth), "x").dump().size(), 2u * kMaxJsonDepth);
  expect_refused_promptly([] { parse_json(nested_arrays(kMaxJsonDepth + 1), "'t.json'"); },
                          {"'t.json' nests arrays and objects deeper than 64 levels"});
  // Brackets inside strings, escaped quotes included, do not count.
  EXPECT_NO_THROW(parse_json("[\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"]", "x"));
  expect_refused_promptly([] { parse_json("{not json", "'c.json'"); }, {"'c.json' is not valid JSON"});
}

// The fuzz corpus's GPT-2-style tokenizer.json with a normalizer that is a
// Sequence nested `depth` deep.
std::string deep_sequence_tokenizer(int depth) {
  std::ifstream in(std::string(fsdp::testing::kSourceDir) + "/tests/fuzz/corpus/tokenizer_json/gpt2_style_pairs.json");
  const std::string base((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "\"normalizer\": null";
  const auto at = base.find(key);
  EXPECT_NE(at, std::string::npos);
  std::string normalizer;
  for (int i = 0; i < depth; ++i) normalizer += R"({"type":"Sequence","normalizers":[)";
  normalizer += R"({"type":"NFC"})";
  for (int i = 0; i < depth; ++i) normalizer += "]}";
  return base.substr(0, at) + "\"normalizer\": " + normalizer + base.substr(at + key.size());
}

TEST(InputFile, ATokenizerNestedFiftyThousandDeepIsRefusedNotACrash) {
  // Each level of a Sequence is two levels of JSON; 20 levels are read.
  EXPECT_NO_THROW(data::Tokenizer::from_tokenizer_json_text(deep_sequence_tokenizer(20), "", "'ok/tokenizer.json'"));
  for (const int depth : {40, 5000, 50000}) {
    expect_refused_promptly(
        [&] { data::Tokenizer::from_tokenizer_json_text(deep_sequence_tokenizer(depth), "", "'deep/tokenizer.json'"); },
        {"'deep/tokenizer.json' nests arrays and objects deeper than 64 levels"});
  }
}

}  // namespace
}  // namespace fsdp::io
