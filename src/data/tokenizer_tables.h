#pragma once
// What a BPE tokenizer is made of once read, shared read-only by every
// Tokenizer (and thread) that encodes with it; and the helpers both readers
// (tokenizer.json, GPT-2's files) build it with. Two kinds: byte-level
// (GPT-2, Llama 3, Qwen: BPE starts from the text's bytes, each a token)
// and SentencePiece-style (Llama 2, Mistral: BPE starts from characters,
// spaces written as "▁", bytes only for characters outside the vocabulary).
// Private to src/data.

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <unicode/regex.h>
#include <unicode/umachine.h>

namespace fsdp::data {

struct TokenizerTables {
  struct AddedToken {
    std::string content;
    int32_t id;
    bool special = false;  // tokenizer.json's "special": a control token (<|im_end|>), not text (<think>)
  };
  // Normalisation, applied in order to the text between added tokens.
  struct Normalizer {
    enum class Kind { kNfc, kPrepend, kReplace } kind;
    std::string text;         // kPrepend: put before non-empty text; kReplace: each occurrence of it...
    std::string replacement;  // kReplace: ...becomes this
  };
  // Pre-tokenisation, applied in order to every piece of text.
  struct Step {
    enum class Kind { kSplit, kPrefixSpace, kMetaspace } kind;
    // kSplit: each match and each run of text between matches is a piece
    // (Hugging Face's "Isolated" behaviour).
    std::shared_ptr<const icu::RegexPattern> pattern;
    // kMetaspace: spaces become `replacement`, which is put before a piece
    // that does not start with it (always, or only before the text's first
    // piece); with `split`, each replacement starts a new piece.
    enum class Prepend { kAlways, kFirst, kNever };
    std::string replacement;
    Prepend prepend = Prepend::kAlways;
    bool split = true;
  };
  // Decoding of a SentencePiece-style tokenizer: token spellings through
  // these, in order, as Hugging Face's decoders (one string per token).
  struct Decoder {
    enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
    std::string text;         // kReplace: replaced; kStrip: the character stripped; kMetaspace: the replacement
    std::string replacement;  // kReplace
    size_t start = 0, stop = 0;  // kStrip: at most this many from each end of each token
    bool prepend = true;         // kMetaspace: the first token's replacements are dropped, not spaces
  };

  std::string source;                                                // for messages
  std::unordered_map<std::string, int32_t> vocab;                    // spelling -> id
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // merge_key -> (rank, merged)
  // id -> what it decodes to: its bytes (byte-level), else its spelling,
  // which `decoders` turn into text. Empty where no token has the id.
  std::vector<std::string> bytes_of;
  std::vector<AddedToken> added;                             // matched in raw text, longest first
  std::array<std::vector<size_t>, 256> added_by_first_byte;  // indices into `added`, longest first
  std::vector<Normalizer> normalizers;
  std::vector<Step> steps;
  bool ignore_merges = false;  // a piece spelled as one vocabulary token is that token (Llama 3)
  int32_t separator = -1;      // see Tokenizer::document_separator
  // What the post-processor puts before a text (Hugging Face's
  // add_special_tokens=True): Llama's and Mistral's BOS; none for Qwen.
  std::vector<int32_t> template_prefix;
  // tokenizer_config.json's special tokens by name (bos_token, eos_token,
  // pad_token, unk_token): the variables a chat template reads.
  std::map<std::string, std::string> special_tokens;

  bool byte_level = true;
  // Byte-level: id of each byte's own token.
  std::array<int32_t, 256> byte_token{};
  // SentencePiece-style: ids of the one-character tokens; a character with
  // none becomes its bytes' <0xNN> tokens (with byte_fallback, and where all
  // of them exist), else `unk` (consecutive ones fused into one with
  // `fuse_unk`), else nothing, as in Hugging Face's BPE.
  std::unordered_map<UChar32, int32_t> char_token;
  bool byte_fallback = false;
  std::array<int32_t, 256> byte_fallback_token{};  // id of <0xNN>, or -1
  int32_t unk = -1;
  bool fuse_unk = false;
  // Where not empty, pieces are cut before each `word_start` that follows
  // another character before merging: no token spans such a cut (checked
  // when read), so the ids are the same, and the cut words repeat, which
  // the cache needs ([Note: cutting SentencePiece text into words]).
  std::string word_start;
  std::vector<Decoder> decoders;
};

// The key of the merge of tokens `left` and `right` in TokenizerTables::merges.
inline uint64_t merge_key(int32_t left, int32_t right) {
  return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
}

// Every occurrence of `from` (not empty) in `s`, left to right, becomes `to`.
void replace_all(std::string& s, const std::string& from, const std::string& to);

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

// With vocab, added, source and byte_level filled: checks that every byte
// has its token (byte-level), resolves each merge (ranked by position) to
// ids, and fills bytes_of, char_token, byte_fallback_token, word_start and
// the document separator (`bos` and `eos` from tokenizer_config.json, empty
// when absent).
void finish_tables(TokenizerTables& tables, const std::vector<std::pair<std::string, std::string>>& merges,
                   const std::string& bos, const std::string& eos);

// Hugging Face's decoders (TokenizerTables::decoders) over token spellings
// (none: the tokens are bytes already); the text is the strings
// concatenated.
std::string run_decoders(const std::vector<TokenizerTables::Decoder>& decoders, std::vector<std::string> tokens);

}  // namespace fsdp::data
