#pragma once
// `fsdp data prepare`: raw text to train/val token files with a byte-level
// BPE tokenizer (a tokenizer.json, or GPT-2's original files).
// Light header: no LibTorch.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::data {

struct PrepareOptions {
  // Each a .txt/.json/.jsonl/.parquet file, a directory of them, or a glob
  // pattern of them; read in the order given, one corpus.
  std::vector<std::string> inputs;
  std::string text_field = "text";  // the field (column) of a .json, .jsonl or .parquet file that holds the text
  // The command that prints a Parquet file's text column as JSON strings,
  // one per line, given the file and the field (tools/parquet_text.py
  // under the venv's Python); empty: Parquet files are refused.
  std::vector<std::string> parquet_reader;
  // What ends a document inside a .txt file: unset, one or more blank
  // (empty or whitespace) lines; empty, nothing (each file one document);
  // else that exact text.
  std::optional<std::string> txt_separator;
  std::string out_dir;         // writes train.bin and val.bin (or train_NNNNNN.bin shards)
  std::string tokenizer_dir;   // holds tokenizer.json, or encoder.json and vocab.bpe
  double val_fraction = 0.05;  // share of documents held out, spread over the corpus; 0: no val
  bool validation_only = false;  // every document to val.bin: a validation set prepared apart
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
  int32_t separator = -1;  // the token before each document (none for chat data)
  bool examples = false;   // chat data: examples with loss masks (fsdp/data/chat_data.h)
  bool preference_pairs = false;  // preference data: documents are pairs, two examples each
  int64_t trained_tokens = 0;   // chat data: tokens the loss covers, both splits
  int64_t longest_example = 0;  // chat data: in tokens
  int64_t answers_left_out = 0; // chat data: assistant messages outside the loss (fsdp/data/chat_data.h)
  std::string tokenizer;   // what was read
  std::string note;        // how the validation split was made, when not by the every-N rule
  bool split_txt = false;  // some .txt file was cut into several documents
  // Token files an earlier prepare had left in the folder that this one
  // does not write, removed (a glob over the folder would take them).
  std::vector<std::string> removed;
};

// Each document is a part of a .txt file (see txt_separator), the text
// field of one .json file (the demo corpus's layout), or the text field of
// each line of a .jsonl file. When the first record of the first .jsonl or
// .json file is chat data (fsdp/data/chat_data.h), every record is, and
// each is an example: its tokens under the chat template of
// `tokenizer_dir`, without separators, with NAME.mask beside each token
// file (fsdp/data/loss_mask.h), split every k-th example as documents are.
// Documents are taken in sorted file order (lines in order), each preceded
// by the tokenizer's document separator (<|endoftext|> for GPT-2 and Qwen,
// <|begin_of_text|> for Llama 3); every k-th goes to val, k = round(1 / fraction). The
// result does not depend on the number of threads.
PrepareStats prepare_corpus(const PrepareOptions& options);

// A size for people: "812 B", "25.3 KB", "4.1 MB", "2.0 GB" (powers of 1000).
std::string human_bytes(int64_t bytes);

}  // namespace fsdp::data
