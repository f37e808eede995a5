// GPT-2's tokenizer against the reference encoder (gpt-3-encoder's
// Encoder.js, a port of OpenAI's encoder.py, run with Node.js) on strings
// chosen to exercise each branch of the pre-tokenisation pattern.

#include "fsdp/data/gpt2_tokenizer.h"

#include "fsdp/common/error.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace fsdp::data {
namespace {

const std::string kDir = std::string(FSDP_SOURCE_DIR) + "/data/gpt2";

bool have_reference() {
  return std::ifstream(kDir + "/Encoder.js").good() && std::system("node --version > /dev/null 2>&1") == 0;
}

// Ids from the reference encoder for each string (one line each).
std::vector<std::vector<int32_t>> reference_ids(const std::vector<std::string>& texts) {
  const std::string input = "/tmp/fsdp-tokenizer-input-" + std::to_string(::getpid()) + ".json";
  {
    std::ofstream out(input);
    out << "[";
    for (size_t i = 0; i < texts.size(); ++i) {
      out << (i ? "," : "") << "\"";
      for (unsigned char c : texts[i]) {
        if (c == '"' || c == '\\') {
          out << '\\' << c;
        } else if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out << buf;
        } else {
          out << c;
        }
      }
      out << "\"";
    }
    out << "]";
  }
  const std::string cmd = "node -e \"const e=require('" + kDir + "/Encoder.js');const fs=require('fs');" +
                          "for (const t of JSON.parse(fs.readFileSync('" + input + "','utf8'))) " +
                          "console.log(e.encode(t).join(','))\"";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  std::vector<std::vector<int32_t>> out;
  char line[1 << 16];
  while (std::fgets(line, sizeof(line), pipe) != nullptr) {
    std::vector<int32_t> ids;
    std::stringstream ss(line);
    std::string id;
    while (std::getline(ss, id, ',')) {
      if (!id.empty() && id != "\n") ids.push_back(std::stoi(id));
    }
    out.push_back(ids);
  }
  ::pclose(pipe);
  return out;
}

TEST(GPT2Tokenizer, MatchesTheReferenceEncoder) {
  if (!have_reference()) GTEST_SKIP() << "needs data/gpt2 (scripts/fetch_data.sh) and Node.js";
  const std::vector<std::string> texts = {
      "Hello world",
      "Hello, world! How's it going? I'm fine; they'll see, we've done, you'd say, it's 'quoted'.",
      "  leading spaces, trailing spaces   ",
      "tabs\tand\nnewlines\n\n\nand \r\n windows line ends",
      "numbers 12345 3.14159 1,000,000 and 2nd 3rd",
      "Ünïcödé: café naïve façade, Ελληνικά, русский текст, 日本語のテキスト, 中文",
      "emoji 👋🌍🎉 and symbols ©®™ → ≠ ∞ — “curly quotes”",
      "mixedCASE identifiers_with_underscores and camelCaseWords",
      "<|endoftext|> is plain text here",
      "punctuation!!! ??? ... --- ___ *** $$$ %%% @@@ ###",
      "a",
      "",
  };
  GPT2Tokenizer tokenizer(kDir + "/encoder.json", kDir + "/vocab.bpe");
  const auto expected = reference_ids(texts);
  ASSERT_EQ(expected.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(tokenizer.encode(texts[i]), expected[i]) << "text: '" << texts[i] << "'";
    EXPECT_EQ(tokenizer.decode(tokenizer.encode(texts[i])), texts[i]) << "round trip";
  }
}

TEST(GPT2Tokenizer, KnownIds) {
  if (!std::ifstream(kDir + "/encoder.json").good()) GTEST_SKIP() << "needs data/gpt2 (scripts/fetch_data.sh)";
  GPT2Tokenizer tokenizer(kDir + "/encoder.json", kDir + "/vocab.bpe");
  // Well-known GPT-2 ids: "Hello" 15496, " world" 995, "!" 0, "<|endoftext|>" 50256 only as a special id.
  EXPECT_EQ(tokenizer.encode("Hello world!"), (std::vector<int32_t>{15496, 995, 0}));
  EXPECT_EQ(tokenizer.vocab_size(), 50257);
  EXPECT_EQ(tokenizer.decode({50256}), "<|endoftext|>");
}

TEST(GPT2Tokenizer, InvalidUtf8IsRefusedNamingTheByte) {
  if (!std::ifstream(kDir + "/encoder.json").good()) GTEST_SKIP() << "needs data/gpt2 (scripts/fetch_data.sh)";
  GPT2Tokenizer tokenizer(kDir + "/encoder.json", kDir + "/vocab.bpe");
  // "Caf" then a lone lead byte of a two-byte sequence (found by the fuzzer:
  // it used to become U+FFFD silently).
  try {
    tokenizer.encode(std::string("Caf\xc3Q"));
    FAIL() << "accepted invalid UTF-8";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8 at byte 3 (byte 0xc3)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tokenizer.decode(tokenizer.encode("Caf\xc3\xa9")), "Caf\xc3\xa9");
}

TEST(GPT2Tokenizer, MissingFilesAreNamed) {
  try {
    GPT2Tokenizer t("/nonexistent/encoder.json", "/nonexistent/vocab.bpe");
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/encoder.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fsdp::data
