#pragma once
// What a Hugging Face model directory holds beside config.json and the
// weights, so that an export is a model people can use: the special-token
// ids in config.json, generation_config.json (where `generate` learns to
// stop), the chat template, and the tokenizer (`tokenizer.json` and its
// config, or GPT-2's BPE files under Hugging Face's names, vocab.json and
// merges.txt). Written by --export-hf and by `fsdp ckpt export`.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/train/config.h"

namespace fsdp::train {

struct CompanionSources {
  // The Hugging Face directory the model came from (--init-from): its
  // config.json's token ids, generation_config.json and chat template.
  std::string model_dir;
  // The tokenizer: a directory with tokenizer.json, or GPT-2's encoder.json
  // and vocab.bpe (or vocab.json and merges.txt).
  std::string tokenizer_dir;
};

struct CompanionReport {
  std::vector<std::string> written;  // file names, in out_dir
  std::string note;                  // why the tokenizer was left out, if it was; empty otherwise
};

// A run's sources: its --init-from, and the tokenizer its samples use
// (--tokenizer, else --init-from's when it has one, else GPT-2's in data/gpt2).
CompanionSources companion_sources(const TrainConfig& config);

// The special-token ids the sources give: config.json's bos_token_id,
// eos_token_id and pad_token_id (as written there: eos may be a list), else
// the tokenizer's own (tokenizer_config.json's tokens looked up in
// tokenizer.json, or GPT-2's <|endoftext|>). Empty object when neither has any.
nlohmann::json special_token_ids(const CompanionSources& sources);

// The ids that end a text for a Hugging Face directory: its
// generation_config.json's eos_token_id (one id or a list), else its
// config.json's; none when neither names one.
std::vector<int64_t> end_of_text_ids(const std::string& model_dir);
// For a training run: the model directory's (as above) where there is one,
// else the tokenizer's end-of-text token (GPT-2's <|endoftext|>, or
// tokenizer_config.json's eos_token).
std::vector<int64_t> end_of_text_ids(const CompanionSources& sources);

// Writes the companions into out_dir (which holds an export's config.json):
// the ids into config.json where it has none, generation_config.json (the
// model directory's, else one made from the ids), the chat template and
// special-tokens map when the model directory has them, and the tokenizer
// files when the tokenizer's vocabulary fits `model_vocab` (else none, and
// the report says why). Into a directory without config.json (a LoRA
// adapter's), the tokenizer and chat template only. Throws fsdp::Error
// naming a file it cannot read.
CompanionReport write_hf_companions(const CompanionSources& sources, int64_t model_vocab, const std::string& out_dir);

}  // namespace fsdp::train
