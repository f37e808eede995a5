#pragma once
// `fsdp data prepare`: raw text to train/val token files with GPT-2's BPE.
// Light header: no LibTorch.

#include <cstdint>
#include <string>

namespace fsdp::data {

struct PrepareOptions {
  std::string input;           // a .txt/.json file, or a directory of them
  std::string out_dir;         // writes train.bin and val.bin
  std::string tokenizer_dir;   // holds encoder.json and vocab.bpe
  double val_fraction = 0.05;  // share of documents held out, spread over the corpus
};

struct PrepareStats {
  int64_t documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t bytes = 0;
};

// Each document is one .txt file, or the "text" field of one .json file
// (the demo corpus's layout). Documents are taken in sorted file order, each
// preceded by <|endoftext|>; every k-th goes to val, k = round(1 / fraction).
PrepareStats prepare_corpus(const PrepareOptions& options);

}  // namespace fsdp::data
