#pragma once
// What a byte-level BPE tokenizer is made of once read, shared read-only by
// every Tokenizer (and thread) that encodes with it; and the helpers both
// readers (tokenizer.json, GPT-2's files) build it with. Private to
// src/data.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <unicode/regex.h>

namespace fsdp::data {

struct TokenizerTables {
  struct AddedToken {
    std::string content;
    int32_t id;
  };
  // Pre-tokenisation, applied in order to every piece of text.
  struct Step {
    enum class Kind { kSplit, kPrefixSpace } kind;
    // kSplit: each match and each run of text between matches is a piece
    // (Hugging Face's "Isolated" behaviour).
    std::shared_ptr<const icu::RegexPattern> pattern;
  };

  std::string source;                                                // for messages
  std::unordered_map<std::string, int32_t> vocab;                    // byte-level spelling -> id
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // merge_key -> (rank, merged)
  std::array<int32_t, 256> byte_token{};                             // id of each byte's own token
  std::vector<std::string> bytes_of;                                 // id -> the bytes it decodes to
  std::vector<AddedToken> added;                                     // matched in raw text, longest first
  std::array<std::vector<size_t>, 256> added_by_first_byte;          // indices into `added`, longest first
  std::vector<Step> steps;
  bool nfc = false;            // NFC-normalise text between added tokens
  bool ignore_merges = false;  // a piece spelled as one vocabulary token is that token (Llama 3)
  int32_t separator = -1;      // see Tokenizer::document_separator
};

// The key of the merge of tokens `left` and `right` in TokenizerTables::merges.
inline uint64_t merge_key(int32_t left, int32_t right) {
  return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
}

// A tokenizer file's text; throws naming the path (and `hint`, where to get it).
std::string read_tokenizer_file(const std::string& path, const std::string& hint = "");

// GPT-2's split pattern (also what a ByteLevel pre-tokenizer with
// use_regex applies).
extern const char* const kGpt2SplitPattern;

// Byte-level BPE's alphabet: printable bytes stand for themselves, the
// others for U+0100 + n in byte order; UTF-8 of each byte's stand-in.
const std::array<std::string, 256>& byte_level_alphabet();

// Compiles a split pattern written for Oniguruma (Hugging Face) or Python's
// `regex` (OpenAI) for ICU: \s and \S become White_Space and its
// complement, which is what those engines mean by them. `literal`: the
// pattern is a plain string.
std::shared_ptr<const icu::RegexPattern> compile_split_pattern(const std::string& pattern, bool literal,
                                                               const std::string& where);

// With vocab, added and source filled: checks that every byte has its
// token, resolves each merge (ranked by position) to ids, and fills
// bytes_of and the document separator (`bos` and `eos` from
// tokenizer_config.json, empty when absent).
void finish_tables(TokenizerTables& tables, const std::vector<std::pair<std::string, std::string>>& merges,
                   const std::string& bos, const std::string& eos);

}  // namespace fsdp::data
