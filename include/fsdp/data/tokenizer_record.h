#pragma once
// Which tokenizer made a directory of token files. llm.c's format holds only
// ids, so `fsdp data prepare` leaves tokenizer_record.json beside them (no
// reader of llm.c's files looks at it), and `fsdp train` compares it with
// the model's tokenizer: ids from another vocabulary train without any
// error, into a model that then speaks nonsense. Light header: no LibTorch.

#include <cstdint>
#include <optional>
#include <string>

#include "fsdp/data/tokenizer.h"

namespace fsdp::data {

inline constexpr const char* kTokenizerRecordFile = "tokenizer_record.json";

struct TokenizerRecord {
  std::string source;       // what was read, for messages
  int64_t vocab_size = 0;
  std::string fingerprint;  // of the vocabulary: every id's text, in id order
  int32_t separator = -1;   // the token before each document
};

// The record of a tokenizer. Two tokenizers with the same vocabulary (GPT-2's
// tokenizer.json and its BPE files) have the same fingerprint.
TokenizerRecord record_of(const Tokenizer& tokenizer);

void write_tokenizer_record(const std::string& dir, const TokenizerRecord& record);
// The record in the directory of TOKEN_FILE, if there is one. Throws
// fsdp::Error naming the file when it is malformed.
std::optional<TokenizerRecord> tokenizer_record_beside(const std::string& token_file);

}  // namespace fsdp::data
