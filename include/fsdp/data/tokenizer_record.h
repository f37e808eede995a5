#pragma once
// Which tokenizer made a directory of token files. llm.c's format holds only
// ids, so `fsdp data prepare` leaves tokenizer_record.json beside them (no
// reader of llm.c's files looks at it), and `fsdp train` compares it with
// the model's tokenizer: ids from another vocabulary train without any
// error, into a model that then speaks nonsense. Light header: no LibTorch.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/data/tokenizer.h"

namespace fsdp::data {

inline constexpr const char* kTokenizerRecordFile = "tokenizer_record.json";

struct TokenizerRecord {
  std::string source;       // what was read, for messages
  int64_t vocab_size = 0;
  std::string fingerprint;  // of the vocabulary: every id's text, in id order
  int32_t separator = -1;   // the token before each document
  // The token files of the folder this record vouches for, by name. Empty
  // in records written before they were listed: then every file is taken.
  std::vector<std::string> files;
  // False while `data prepare` writes the folder: a prepare that stopped
  // midway leaves a record no run trains past.
  bool complete = true;
  // Chat data: each token file has its loss mask beside it
  // (fsdp/data/loss_mask.h), and a run trains on whole examples.
  bool examples = false;
  // Preference data: examples come in pairs, chosen then rejected, the
  // same prompt before each (fsdp/data/chat_data.h's encode_preference).
  bool preference_pairs = false;
};

// The record of a tokenizer. Two tokenizers with the same vocabulary (GPT-2's
// tokenizer.json and its BPE files) have the same fingerprint.
TokenizerRecord record_of(const Tokenizer& tokenizer);

void write_tokenizer_record(const std::string& dir, const TokenizerRecord& record);
// The record in the directory of TOKEN_FILE, if there is one. Throws
// fsdp::Error naming the file when it is malformed or not a regular file,
// when its prepare did not finish, and when it lists its files and
// TOKEN_FILE is not one of them (a shard left by an earlier prepare).
std::optional<TokenizerRecord> tokenizer_record_beside(const std::string& token_file);

}  // namespace fsdp::data
