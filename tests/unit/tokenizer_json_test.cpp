// Hugging Face tokenizer.json files read by the BPE tokenizer, byte-level
// (Llama 3, Qwen3, GPT-2) and SentencePiece-style (Mistral, in Llama 2's
// format), against independent encoders run by Node.js:
// @huggingface/tokenizers on the same tokenizer.json and, for Llama 3,
// llama3-tokenizer-js with its own copy of the vocabulary. Small
// tokenizer.json files written here pin the semantics (ignore_merges,
// merge spellings, the separator rule, byte fallback, Metaspace, the
// decoders) by hand and the refusals by name.

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_paths.h"
#include "fsdp/common/error.h"
#include "fsdp/data/tokenizer.h"
#include "reference_encoder.h"

namespace fsdp::data {
namespace {

using nlohmann::json;
using testing::reference_ids;
using testing::reference_missing;

const std::string kData = std::string(fsdp::testing::kSourceDir) + "/data";

// Each kind of text the pre-tokenizers treat differently.
const std::vector<std::string> kVariedTexts = {
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    // contractions, in both cases (Llama 3 and Qwen match them case-insensitively)
    "I'm sure they'll see we've done it; you'd say it's 'quoted'. I'M SURE THEY'LL, DON'T, We'Ve",
    // accents, precomposed and combining (Qwen normalises to NFC)
    "café naïve façade Ünïcödé — cafe\xcc\x81 nai\xcc\x88ve",
    // CJK, Cyrillic, Greek, Arabic, Hindi
    "日本語のテキストです。中文文本，한국어 텍스트. русский текст, Ελληνικά, العربية, हिन्दी",
    // emoji, including joiners and skin tones
    "emoji 👋🌍🎉 👩‍👩‍👧‍👦 👍🏽 ❤️ and symbols ©®™ → ≠ ∞",
    // digit runs (Llama 3 cuts them in threes, Qwen in ones)
    "1 12 123 1234 12345 123456789012 3.14159 1,000,000 2nd 0x1F 007",
    // whitespace runs, tabs, newlines, CR LF
    "a  b   c    d\t\te\n\nf\r\n\r\ng     \n   h   ",
    "    leading and trailing    ",
    "code:\n    if (x) {\n\treturn y;\n    }\n",
    // punctuation runs
    "punctuation!!! ??? ... --- ___ *** $$$ %%% @@@ ### (()) [[]] {{}}",
    "mixedCASE identifiers_with_underscores camelCaseWords URL https://example.com/a?b=c&d=e",
    "a",
    "",
};

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One address of the demo corpus: a long real document.
std::string long_document() {
  const auto path = kData + "/sotu/1861_abraham_lincoln_r.json";
  return std::filesystem::exists(path) ? json::parse(read(path))["text"].get<std::string>() : "";
}

void expect_reference(const Tokenizer& tokenizer, const std::string& mode, const std::string& dir,
                      const std::vector<std::string>& texts) {
  const auto expected = reference_ids(mode, dir, texts);
  ASSERT_EQ(expected.size(), texts.size()) << "the reference printed too few lines";
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(tokenizer.encode(texts[i]), expected[i]) << mode << " on '" << texts[i].substr(0, 200) << "'";
  }
}

TEST(TokenizerJson, Llama3MatchesBothReferenceEncoders) {
  const auto dir = kData + "/llama3";
  for (const auto* mode : {"hf", "llama3-js"}) {
    if (const auto why = reference_missing(mode, dir); !why.empty()) GTEST_SKIP() << why;
  }
  const auto tokenizer = Tokenizer::from_dir(dir);
  auto texts = kVariedTexts;
  texts.push_back("<|begin_of_text|>special tokens<|end_of_text|> in text <|eot_id|><|start_header_id|>user");
  texts.push_back(std::string(3000, 'a'));  // one long piece: merging must not be quadratic
  texts.push_back(long_document());
  expect_reference(*tokenizer, "hf", dir, texts);
  expect_reference(*tokenizer, "llama3-js", dir, texts);
  for (const auto& t : texts) EXPECT_EQ(tokenizer->decode(tokenizer->encode(t)), t) << "round trip";
  // The published example (llama3-tokenizer-js's README) and the special ids.
  EXPECT_EQ(tokenizer->encode("Hello world!"), (std::vector<int32_t>{9906, 1917, 0}));
  EXPECT_EQ(tokenizer->vocab_size(), 128256);
  EXPECT_EQ(tokenizer->document_separator(), 128000) << "tokenizer_config.json's bos_token, <|begin_of_text|>";
  EXPECT_EQ(tokenizer->decode({128000, 9906}), "<|begin_of_text|>Hello");
}

TEST(TokenizerJson, Qwen3MatchesTheReferenceEncoder) {
  const auto dir = kData + "/qwen3";
  if (const auto why = reference_missing("hf", dir); !why.empty()) GTEST_SKIP() << why;
  const auto tokenizer = Tokenizer::from_dir(dir);
  auto texts = kVariedTexts;
  texts.push_back("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n</think>ok<|endoftext|>");
  texts.push_back(long_document());
  expect_reference(*tokenizer, "hf", dir, texts);
  // NFC: the combining accent becomes the precomposed character.
  EXPECT_EQ(tokenizer->encode("cafe\xcc\x81"), tokenizer->encode("caf\xc3\xa9"));
  EXPECT_EQ(tokenizer->vocab_size(), 151669);
  EXPECT_EQ(tokenizer->document_separator(), 151643) << "<|endoftext|>";
}

TEST(TokenizerJson, Gpt2TokenizerJsonMatchesOpenAIsEncoder) {
  // The same tokenizer as data/gpt2's original files, written as a
  // tokenizer.json (ByteLevel with use_regex): ids equal to OpenAI's
  // encoder wherever the text has no <|endoftext|>, which tokenizer.json
  // makes an added token.
  const auto dir = kData + "/gpt2-hf";
  if (const auto why = reference_missing("gpt2-js", kData + "/gpt2"); !why.empty()) GTEST_SKIP() << why;
  if (const auto why = reference_missing("hf", dir); !why.empty()) GTEST_SKIP() << why;
  const auto tokenizer = Tokenizer::from_dir(dir);
  auto texts = kVariedTexts;
  texts.push_back(long_document());
  expect_reference(*tokenizer, "gpt2-js", kData + "/gpt2", texts);
  expect_reference(*tokenizer, "hf", dir, {"before<|endoftext|>after", " <|endoftext|><|endoftext|>"});
  EXPECT_EQ(tokenizer->encode("a<|endoftext|>b"), (std::vector<int32_t>{64, 50256, 65}));
}

TEST(TokenizerJson, MistralMatchesTheReferenceEncoder) {
  // Llama 2's format (Prepend and Replace normalisers, no pre-tokenizer,
  // byte fallback), Mistral 7B's vocabulary.
  const auto dir = kData + "/mistral";
  if (const auto why = reference_missing("hf", dir); !why.empty()) GTEST_SKIP() << why;
  const auto tokenizer = Tokenizer::from_dir(dir);
  auto texts = kVariedTexts;
  texts.push_back("<s>special tokens</s> in text <unk>, <s> after a space,</s>");
  texts.push_back(" \u2581 the replacement character itself \u2581\u2581x");
  texts.push_back(long_document());
  expect_reference(*tokenizer, "hf", dir, texts);
  for (const auto& t : kVariedTexts) EXPECT_EQ(tokenizer->decode(tokenizer->encode(t)), t) << "round trip";
  // mistral-tokenizer-js's published example, less its <s>; and the ids a
  // model needs.
  EXPECT_EQ(tokenizer->encode("Hello world!"), (std::vector<int32_t>{22557, 1526, 28808}));
  EXPECT_EQ(tokenizer->vocab_size(), 32000);
  EXPECT_EQ(tokenizer->document_separator(), 1) << "tokenizer_config.json's bos_token, <s>";
  EXPECT_EQ(tokenizer->decode({1, 22557, 1526, 28808}), "<s> Hello world!");
  EXPECT_EQ(tokenizer->decode_continuation({22557}, {1526, 28808}), " world!");
  EXPECT_EQ(tokenizer->decode_continuation({1}, {22557}), "Hello") << "text after <s> starts anew";
}

// A byte-level tokenizer.json small enough to reason about by hand: the
// 256 byte tokens (ids 0..255 in alphabet order), then the merges' tokens.
json tiny_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const int cp = printable ? b : next++;
    std::string utf8;
    if (cp < 0x80) {
      utf8 = std::string(1, static_cast<char>(cp));
    } else {
      utf8 = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
    vocab[utf8] = b;
  }
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = static_cast<int>(vocab.size());
    merge_list.push_back(a + " " + b);
  }
  return {{"version", "1.0"},
          {"added_tokens", json::array({{{"id", 1000}, {"content", "<eos>"}, {"special", true}}})},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}, {"ignore_merges", false}}}};
}

std::unique_ptr<Tokenizer> from_json(const json& j, const std::string& config = "") {
  return Tokenizer::from_tokenizer_json_text(j.dump(), config, "'test/tokenizer.json'");
}

TEST(TokenizerJson, MergesByRankAndIgnoreMergesTakesWholeWords) {
  // Merges: a b (256), ab c (257); "bc" is in the vocabulary (258) but no
  // merge makes it. 'a' = 97, 'b' = 98, 'c' = 99.
  auto j = tiny_tokenizer({{"a", "b"}, {"ab", "c"}});
  j["model"]["vocab"]["bc"] = 258;
  EXPECT_EQ(from_json(j)->encode("abc"), (std::vector<int32_t>{257}));
  EXPECT_EQ(from_json(j)->encode("bc"), (std::vector<int32_t>{98, 99})) << "no merge makes bc";
  EXPECT_EQ(from_json(j)->encode("aab"), (std::vector<int32_t>{97, 256}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(from_json(j)->encode("bc"), (std::vector<int32_t>{258})) << "the whole word is a token";
  EXPECT_EQ(from_json(j)->encode("bcb"), (std::vector<int32_t>{98, 99, 98}));
  // Merges as pairs give the same tokenizer.
  auto pairs = tiny_tokenizer({{"a", "b"}, {"ab", "c"}});
  pairs["model"]["merges"] = json::array({json::array({"a", "b"}), json::array({"ab", "c"})});
  EXPECT_EQ(from_json(pairs)->encode("xabcab"), (std::vector<int32_t>{120, 257, 256}));
  // Lower rank first, whatever the position: with c d ranked before a b,
  // "abcd" merges c d first.
  const auto ranked = from_json(tiny_tokenizer({{"c", "d"}, {"b", "c"}, {"a", "b"}}));
  EXPECT_EQ(ranked->encode("abcd"), (std::vector<int32_t>{258, 256})) << "ab + cd, never a + bc + d";
  // ByteLevel's add_prefix_space puts a space before the text.
  auto prefixed = tiny_tokenizer({});
  prefixed["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(from_json(prefixed)->encode("x"), (std::vector<int32_t>{32, 120}));
  EXPECT_EQ(from_json(prefixed)->encode(" x"), (std::vector<int32_t>{32, 120})) << "one space, not two";
}

TEST(TokenizerJson, ARepeatedMergeTakesItsLastRank) {
  // a b (0), b c (1), a b (2): on "abc", b c now outranks a b.
  EXPECT_EQ(from_json(tiny_tokenizer({{"a", "b"}, {"b", "c"}, {"a", "b"}}))->encode("abc"),
            (std::vector<int32_t>{97, 257}));
}

// A SentencePiece-style tokenizer.json in Llama 2's form, small enough to
// reason about by hand: <unk> 0, <s> 1, </s> 2, the byte tokens <0x00> ..
// <0xFF> as 3 .. 258, then "▁" 259, "a" 260, "b" 261, "c" 262, and each
// merge's token after them in order.
const std::string kMeta = "\u2581";  // ▁

json tiny_sentencepiece(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char spelled[8];
    std::snprintf(spelled, sizeof(spelled), "<0x%02X>", b);
    vocab[spelled] = 3 + b;
  }
  vocab[kMeta] = 259;
  vocab["a"] = 260;
  vocab["b"] = 261;
  vocab["c"] = 262;
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = static_cast<int>(vocab.size());
    merge_list.push_back(a + " " + b);
  }
  json added = json::array();
  for (const auto& [id, content] : std::vector<std::pair<int, std::string>>{{0, "<unk>"}, {1, "<s>"}, {2, "</s>"}}) {
    added.push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  const json replace_meta = {{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}};
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", kMeta}},
                                         {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}}})}}},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders", json::array({replace_meta,
                                      {{"type", "ByteFallback"}},
                                      {{"type", "Fuse"}},
                                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", "<unk>"},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", true},
            {"byte_fallback", true},
            {"vocab", vocab},
            {"merges", merge_list}}}};
}

// ▁a (263), ab (264), ▁ab (265).
const std::vector<std::pair<std::string, std::string>> kAbMerges = {{kMeta, "a"}, {"a", "b"}, {kMeta + "a", "b"}};

TEST(TokenizerJson, SentencePieceStyleWritesSpacesAsMetaAndFallsBackToBytes) {
  const auto t = from_json(tiny_sentencepiece(kAbMerges));
  // "▁ab": ▁ a first (rank 0), then ▁a b (rank 2).
  EXPECT_EQ(t->encode("ab"), (std::vector<int32_t>{265}));
  // "▁ab▁c": no merge makes ▁c.
  EXPECT_EQ(t->encode("ab c"), (std::vector<int32_t>{265, 259, 262}));
  // The Prepend normaliser adds ▁ even before a space: "▁▁a".
  EXPECT_EQ(t->encode(" a"), (std::vector<int32_t>{259, 263}));
  // Each run of text between added tokens is normalised alone.
  EXPECT_EQ(t->encode("<s>ab</s>c"), (std::vector<int32_t>{1, 265, 2, 259, 262}));
  // é (C3 A9) has no token: its bytes' tokens, 3 + 0xC3 and 3 + 0xA9.
  EXPECT_EQ(t->encode("\u00e9"), (std::vector<int32_t>{259, 198, 172}));
  EXPECT_EQ(t->encode(""), (std::vector<int32_t>{}));
  EXPECT_EQ(t->vocab_size(), 266);

  // Without byte fallback, unknown characters are <unk>, fused when in a row.
  auto unk = tiny_sentencepiece(kAbMerges);
  unk["model"]["byte_fallback"] = false;
  EXPECT_EQ(from_json(unk)->encode("a\u00e9\u00e9b"), (std::vector<int32_t>{263, 0, 261}));
  unk["model"]["fuse_unk"] = false;
  EXPECT_EQ(from_json(unk)->encode("a\u00e9\u00e9b"), (std::vector<int32_t>{263, 0, 0, 261}));
  // With neither, they are dropped, as Hugging Face's BPE drops them, and
  // ▁ a b merge as if they had never been there.
  unk["model"]["unk_token"] = nullptr;
  EXPECT_EQ(from_json(unk)->encode("a\u00e9\u00e9b"), (std::vector<int32_t>{265}));
  // With byte fallback but without <0xBC>, ü (C3 BC) is <unk>, which waits
  // for the next character with a token: the é after it comes first.
  auto partial = tiny_sentencepiece(kAbMerges);
  partial["model"]["vocab"].erase("<0xBC>");
  EXPECT_EQ(from_json(partial)->encode("\u00fc\u00e9b"), (std::vector<int32_t>{259, 198, 172, 0, 261}));
}

TEST(TokenizerJson, NoMergeCrossesAWordStartUnlessATokenSpansOne) {
  // b▁ (265) ranks before ▁a b (266): in "▁ab▁c" it takes the b first.
  auto merges = kAbMerges;
  merges.insert(merges.begin() + 2, {"b", kMeta});
  const auto t = from_json(tiny_sentencepiece(merges));
  EXPECT_EQ(t->encode("ab c"), (std::vector<int32_t>{263, 265, 262}));
  // ▁▁ (266): runs of spaces merge across what would be word starts.
  auto spaces = kAbMerges;
  spaces.push_back({kMeta, kMeta});
  EXPECT_EQ(from_json(tiny_sentencepiece(spaces))->encode("ab  c"), (std::vector<int32_t>{265, 266, 262}));
}

TEST(TokenizerJson, MetaspaceFollowsItsPrependSchemeAndSplit) {
  auto j = tiny_sentencepiece(kAbMerges);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}, {"split", false}};
  const auto first = from_json(j);
  EXPECT_EQ(first->encode("ab c"), (std::vector<int32_t>{265, 259, 262}));
  EXPECT_EQ(first->encode(" ab"), (std::vector<int32_t>{265})) << "a text starting with a space gets no second ▁";
  EXPECT_EQ(first->encode("<s>ab"), (std::vector<int32_t>{1, 264})) << "only the text's first piece gets ▁";
  j["pre_tokenizer"]["prepend_scheme"] = "always";
  EXPECT_EQ(from_json(j)->encode("<s>ab"), (std::vector<int32_t>{1, 265}));
  j["pre_tokenizer"]["prepend_scheme"] = "never";
  EXPECT_EQ(from_json(j)->encode("ab"), (std::vector<int32_t>{264}));
  // The older spelling: add_prefix_space true is "always".
  j["pre_tokenizer"].erase("prepend_scheme");
  j["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(from_json(j)->encode("<s>ab"), (std::vector<int32_t>{1, 265}));
  // split (the default) makes each ▁ start a piece: "▁ab▁▁c" is ▁ab | ▁ |
  // ▁c, so ▁▁ (266) is never made; without it, the run merges.
  auto spaces = kAbMerges;
  spaces.push_back({kMeta, kMeta});
  auto split = tiny_sentencepiece(spaces);
  split["normalizer"] = nullptr;
  split["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kMeta}};
  EXPECT_EQ(from_json(split)->encode("ab  c"), (std::vector<int32_t>{265, 259, 259, 262}));
  split["pre_tokenizer"]["split"] = false;
  EXPECT_EQ(from_json(split)->encode("ab  c"), (std::vector<int32_t>{265, 266, 262}));
}

TEST(TokenizerJson, SentencePieceDecodersGiveTheTextBack) {
  const auto t = from_json(tiny_sentencepiece(kAbMerges));
  // " ab" " " "c", fused, less the one space the encoder put first.
  EXPECT_EQ(t->decode({265, 259, 262}), "ab c");
  EXPECT_EQ(t->decode({259, 263}), " a");
  // Byte tokens in a row are UTF-8 (é), else one U+FFFD each.
  EXPECT_EQ(t->decode({259, 198, 172}), "\u00e9");
  EXPECT_EQ(t->decode({260, 198, 260}), "a\ufffda");
  // Added tokens decode to their text, and the space after one is kept.
  EXPECT_EQ(t->decode({1, 265, 2}), "<s> ab</s>");
  EXPECT_EQ(t->decode({}), "");
  // A continuation keeps its first space, except after an added token.
  EXPECT_EQ(t->decode_continuation({265}, {259, 262}), " c");
  EXPECT_EQ(t->decode_continuation({1}, {265}), "ab");
  EXPECT_EQ(t->decode_continuation({}, {265}), "ab");
  // Metaspace's decoder: ▁ is a space, but dropped in the first token.
  auto j = tiny_sentencepiece(kAbMerges);
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(from_json(j)->decode({265, 259, 262}), "ab c");
  EXPECT_EQ(from_json(j)->decode_continuation({265}, {259, 262}), " c");
  j["decoder"]["prepend_scheme"] = "never";
  EXPECT_EQ(from_json(j)->decode({265, 259, 262}), " ab c");
  // Strip takes at most `start` and `stop` copies, from each token before
  // Fuse: " ab" loses its space, "c" and "<s>" keep their text.
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                                            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 1}},
                                            {{"type", "Fuse"}}})}};
  EXPECT_EQ(from_json(j)->decode({265, 262, 1}), "abc<s>");
}

TEST(TokenizerJson, SeparatorIsEndOfTextElseBosElseEos) {
  auto j = tiny_tokenizer({});
  EXPECT_THROW(from_json(j)->document_separator(), Error) << "no <|endoftext|>, no config";
  EXPECT_EQ(from_json(j, R"({"eos_token": "<eos>"})")->document_separator(), 1000);
  EXPECT_EQ(from_json(j, R"({"bos_token": {"content": "a"}, "eos_token": "<eos>"})")->document_separator(), 97);
  j["added_tokens"].push_back({{"id", 1001}, {"content", "<|endoftext|>"}});
  EXPECT_EQ(from_json(j, R"({"bos_token": "a"})")->document_separator(), 1001);
  try {
    from_json(tiny_tokenizer({}), R"({"bos_token": "<s>"})");
    FAIL() << "a bos_token the tokenizer lacks was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'<s>'"), std::string::npos) << e.what();
  }
}

TEST(TokenizerJson, WhatItCannotHonourIsRefusedByName) {
  const auto refused = [](const std::function<void(json&)>& edit, const std::string& expected) {
    auto j = tiny_tokenizer({{"a", "b"}});
    edit(j);
    try {
      from_json(j);
      ADD_FAILURE() << "accepted; expected a refusal naming " << expected;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("test/tokenizer.json"), std::string::npos) << e.what();
    }
  };
  refused([](json& j) { j["model"]["type"] = "WordPiece"; }, "model 'WordPiece'");
  refused([](json& j) { j["model"]["end_of_word_suffix"] = "</w>"; }, "\"end_of_word_suffix\"");
  refused([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "\"continuing_subword_prefix\"");
  refused([](json& j) { j["model"]["dropout"] = 0.1; }, "\"dropout\"");
  refused([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre_tokenizer 'Whitespace'");
  refused([](json& j) { j["pre_tokenizer"] = nullptr; }, "decoder 'ByteLevel' needs a ByteLevel pre_tokenizer");
  refused(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers", json::array({{{"type", "Metaspace"}, {"replacement", "_"}},
                                                             {{"type", "ByteLevel"}}})}};
      },
      "both ByteLevel and Metaspace");
  refused(
      [](json& j) {
        j["pre_tokenizer"] = {
            {"type", "Sequence"},
            {"pretokenizers",
             json::array({{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}}})}};
      },
      "\"behavior\": \"Removed\"");
  refused(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}};
      },
      "needs a ByteLevel pre_tokenizer");
  refused(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}};
      },
      "'(unclosed' does not compile");
  refused([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, "normalizer 'Lowercase'");
  refused([](json& j) { j["decoder"] = {{"type", "Metaspace"}}; }, "decoder");
  refused([](json& j) { j["added_tokens"][0]["lstrip"] = true; }, "'<eos>' sets \"lstrip\"");
  refused([](json& j) { j["model"]["merges"].push_back("a zz"); }, "merge 1 ('a' 'zz') needs 'zz'");
  refused([](json& j) { j["model"]["merges"].push_back(42); }, "merge 42 is neither");
  refused([](json& j) { j["model"]["vocab"].erase("a"); }, "no token for byte 0x61");
  refused([](json& j) { j["model"]["vocab"]["zz"] = -3; }, "token 'zz' has id -3");
  refused([](json& j) { j["model"]["vocab"] = json::array(); }, "no \"vocab\" object");
  refused([](json& j) { j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}}; },
          "normalizer 'Precompiled'");
}

TEST(TokenizerJson, WhatASentencePieceStyleTokenizerCannotHonourIsRefusedByName) {
  const auto refused = [](const std::function<void(json&)>& edit, const std::string& expected) {
    auto j = tiny_sentencepiece(kAbMerges);
    edit(j);
    try {
      from_json(j);
      ADD_FAILURE() << "accepted; expected a refusal naming " << expected;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("test/tokenizer.json"), std::string::npos) << e.what();
    }
  };
  refused([](json& j) { j["model"]["type"] = "Unigram"; }, "model 'Unigram'");
  refused([](json& j) { j["decoder"]["decoders"][1] = {{"type", "WordPiece"}}; }, "decoder 'WordPiece'");
  refused([](json& j) { j["decoder"] = {{"type", "ByteLevel"}}; }, "decoder 'ByteLevel' needs a ByteLevel");
  refused([](json& j) { j["decoder"] = nullptr; }, "no decoder");
  refused([](json& j) { j["normalizer"]["normalizers"][0] = {{"type", "NFKC"}}; }, "normalizer 'NFKC'");
  refused([](json& j) { j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}}; },
          "Replace normalizer with a \"Regex\" pattern");
  refused([](json& j) { j["normalizer"]["normalizers"][1]["pattern"] = {{"String", ""}}; },
          "has no \"pattern\" {\"String\": ...} that is not empty");
  refused([](json& j) { j["decoder"]["decoders"][3]["start"] = -1; }, "Strip decoder \"start\" is -1");
  refused([](json& j) { j["model"]["unk_token"] = "<unknown>"; }, "unk_token \"<unknown>\" is not in its vocabulary");
  refused([](json& j) { j["model"]["byte_fallback"] = "yes"; }, "\"byte_fallback\" is \"yes\"");
  refused([](json& j) { j["added_tokens"][1]["normalized"] = true; }, "'<s>' sets \"normalized\"");
  refused([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "__"}}; },
          "\"replacement\" is \"__\"; expected one character");
  refused([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; },
          "Metaspace pre_tokenizer has no \"replacement\"");
  const json metaspace = {{"type", "Metaspace"}, {"replacement", "_"}};
  refused([&](json& j) { (j["pre_tokenizer"] = metaspace)["prepend_scheme"] = "once"; },
          "\"prepend_scheme\": \"once\" is not supported");
  refused([&](json& j) { (j["pre_tokenizer"] = metaspace)["add_prefix_space"] = false; },
          "\"add_prefix_space\": false, which contradicts");
}

TEST(TokenizerJson, FilesThatAreNotTokenizersAreNamed) {
  try {
    Tokenizer::from_tokenizer_json_text("{not json", "", "'bad/tokenizer.json'");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'bad/tokenizer.json' is not valid JSON"), std::string::npos) << e.what();
  }
  try {
    Tokenizer::from_dir("/nonexistent");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer '/nonexistent' holds neither a tokenizer.json"),
              std::string::npos)
        << e.what();
  }
}

TEST(TokenizerJson, ASplitPatternThatBacktracksWithoutBoundIsStoppedWithAnError) {
  auto j = tiny_tokenizer({});
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"}, {"pattern", {{"Regex", "(a|aa)+$"}}}, {"behavior", "Isolated"}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  const auto t = from_json(j);
  EXPECT_EQ(t->encode("aaaa"), (std::vector<int32_t>{97, 97, 97, 97})) << "the pattern works on short text";
  // 2^60 ways to split the a's, none followed by the end: tried one by one,
  // this would not finish.
  const std::string hostile = std::string(120, 'a') + "b";
  try {
    (void)t->encode(hostile);
    FAIL() << "a catastrophic pattern finished";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backtracks without bound"), std::string::npos) << e.what();
  }
  // The limit is per match: a long document of many quick matches passes.
  std::string document;
  for (int i = 0; i < 1'000'000; ++i) document += " a";
  EXPECT_EQ(from_json(tiny_tokenizer({}))->encode(document).size(), document.size()) << "one token per byte";
}

}  // namespace
}  // namespace fsdp::data
