#pragma once
// `fsdp data prepare`: raw text to train/val token files with a byte-level
// BPE tokenizer (a tokenizer.json, or GPT-2's original files).
// Light header: no LibTorch.

#include <cstdint>
#include <string>

namespace fsdp::data {

struct PrepareOptions {
  std::string input;           // a .txt/.json/.jsonl file, or a directory of them
  std::string out_dir;         // writes train.bin and val.bin (or train_NNNNNN.bin shards)
  std::string tokenizer_dir;   // holds tokenizer.json, or encoder.json and vocab.bpe
  double val_fraction = 0.05;  // share of documents held out, spread over the corpus; 0: no val
  int64_t shard_tokens = 0;    // > 0: split each split into files of at most this many tokens
  int threads = 0;             // 0: every core
  bool progress = true;        // a progress line on stderr
};

struct PrepareStats {
  int64_t documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t bytes = 0;
  int train_files = 0;
  int val_files = 0;
  int32_t separator = -1;  // the token before each document
  std::string tokenizer;   // what was read
  std::string note;        // how the validation split was made, when not by the every-N rule
};

// Each document is one .txt file, the "text" field of one .json file (the
// demo corpus's layout), or the "text" field of each line of a .jsonl file.
// Documents are taken in sorted file order (lines in order), each preceded
// by the tokenizer's document separator (<|endoftext|> for GPT-2 and Qwen,
// <|begin_of_text|> for Llama 3); every k-th goes to val, k = round(1 / fraction). The
// result does not depend on the number of threads.
PrepareStats prepare_corpus(const PrepareOptions& options);

}  // namespace fsdp::data
