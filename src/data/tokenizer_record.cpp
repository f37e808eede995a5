#include "fsdp/data/tokenizer_record.h"

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
  const nlohmann::json j = {{"tokenizer", r.source},
                            {"vocab_size", r.vocab_size},
                            {"vocabulary_fingerprint", r.fingerprint},
                            {"document_separator", r.separator}};
  io::write_file_atomically(dir + "/" + kTokenizerRecordFile, j.dump(2) + "\n");
}

std::optional<TokenizerRecord> tokenizer_record_beside(const std::string& token_file) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(token_file).parent_path() / kTokenizerRecordFile;
  if (!fs::is_regular_file(path)) return std::nullopt;
  try {
    const auto j = io::read_json_file(path.string(), "tokenizer record");
    TokenizerRecord r;
    r.source = j.at("tokenizer").get<std::string>();
    r.vocab_size = j.at("vocab_size").get<int64_t>();
    r.fingerprint = j.at("vocabulary_fingerprint").get<std::string>();
    r.separator = j.at("document_separator").get<int32_t>();
    return r;
  } catch (const std::exception& e) {
    throw Error("'" + path.string() + "' is not a tokenizer record `fsdp data prepare` writes (" + e.what() +
                "); delete it, or prepare the data again");
  }
}

}  // namespace fsdp::data
