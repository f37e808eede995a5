#include "fsdp/data/tokenizer_record.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/io/input_file.h"
#include "fsdp/io/atomic_file.h"

namespace fsdp::data {
namespace {

// FNV-1a, 64 bits: an identity, not a defence against forgery.
void mix(uint64_t& hash, const std::string& bytes) {
  for (const unsigned char c : bytes) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
}

// A record's text as a terminal shows it safely: control characters (an
// escape sequence in a forged record) become '?'.
std::string printable(std::string text) {
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return text;
}

}  // namespace

TokenizerRecord record_of(const Tokenizer& tokenizer) {
  uint64_t hash = 14695981039346656037ULL;
  const int32_t vocab = tokenizer.vocab_size();
  for (int32_t id = 0; id < vocab; ++id) {
    mix(hash, std::to_string(id) + ":");
    mix(hash, tokenizer.decode({id}));
    mix(hash, std::string(1, '\0'));
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  return {tokenizer.source(), vocab, hex, tokenizer.document_separator()};
}

void write_tokenizer_record(const std::string& dir, const TokenizerRecord& r) {
  nlohmann::json j = {{"tokenizer", r.source},
                      {"vocab_size", r.vocab_size},
                      {"vocabulary_fingerprint", r.fingerprint},
                      {"document_separator", r.separator},
                      {"files", r.files},
                      {"complete", r.complete}};
  if (r.examples) j["examples"] = true;
  if (r.preference_pairs) j["preference_pairs"] = true;
  io::write_file_atomically(dir + "/" + kTokenizerRecordFile, j.dump(2) + "\n");
}

std::optional<TokenizerRecord> tokenizer_record_beside(const std::string& token_file) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(token_file).parent_path() / kTokenizerRecordFile;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return std::nullopt;
  FSDP_CHECK(fs::is_regular_file(path, ec), "'", path.string(),
             "' is not a regular file; expected the tokenizer record `fsdp data prepare` writes beside its token files");
  TokenizerRecord r;
  try {
    const auto j = io::read_json_file(path.string(), "tokenizer record");
    r.source = printable(j.at("tokenizer").get<std::string>());
    r.vocab_size = j.at("vocab_size").get<int64_t>();
    r.fingerprint = j.at("vocabulary_fingerprint").get<std::string>();
    r.separator = j.at("document_separator").get<int32_t>();
    if (j.contains("files")) r.files = j.at("files").get<std::vector<std::string>>();
    if (j.contains("complete")) r.complete = j.at("complete").get<bool>();
    if (j.contains("examples")) r.examples = j.at("examples").get<bool>();
    if (j.contains("preference_pairs")) r.preference_pairs = j.at("preference_pairs").get<bool>();
  } catch (const std::exception& e) {
    throw Error("'" + path.string() + "' is not a tokenizer record `fsdp data prepare` writes (" + e.what() +
                "); delete it, or prepare the data again");
  }
  const std::string folder = fs::path(token_file).parent_path().string();
  FSDP_CHECK(r.complete, "'", path.string(), "' says `fsdp data prepare` into '", folder,
             "' did not finish (stopped or failed midway): its token files may be a mix of two prepares. Run "
             "`fsdp data prepare` into it again");
  const std::string name = fs::path(token_file).filename().string();
  FSDP_CHECK(r.files.empty() || std::find(r.files.begin(), r.files.end(), name) != r.files.end(), "'", token_file,
             "' is not one of the token files '", path.string(), "' lists (", r.files.size(),
             " files): left by an earlier prepare into the same folder? Prepare into it again (which removes such "
             "files), or remove it");
  return r;
}

}  // namespace fsdp::data
