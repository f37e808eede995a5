#pragma once
// GPT-2's byte-level BPE tokenizer (OpenAI's encoder.py), reading the
// original encoder.json and vocab.bpe. Pre-tokenisation uses the same
// pattern as the reference, with \s read as Unicode White_Space as Python's
// `regex` module does; ICU supplies the Unicode classes. Light header.

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace fsdp::data {

class GPT2Tokenizer {
 public:
  static constexpr int32_t kEndOfText = 50256;  // <|endoftext|>

  // Throws fsdp::Error naming the file that is missing or malformed.
  GPT2Tokenizer(const std::string& encoder_json_path, const std::string& vocab_bpe_path);
  ~GPT2Tokenizer();

  // Valid UTF-8 text to token ids; "<|endoftext|>" in the text is ordinary
  // text, as in the reference encoder.
  std::vector<int32_t> encode(const std::string& text) const;
  // Token ids to bytes (a sample may end inside a multi-byte character).
  std::string decode(const std::vector<int32_t>& ids) const;
  int32_t vocab_size() const { return static_cast<int32_t>(decoder_.size()); }

 private:
  std::vector<std::string> bpe(const std::string& word) const;  // word in byte-unicode form

  std::unordered_map<std::string, int32_t> encoder_;
  std::vector<std::string> decoder_;
  std::unordered_map<std::string, int> merge_ranks_;  // "a b" -> rank
  std::vector<std::string> byte_to_unicode_;          // UTF-8 of the stand-in character of each byte
  std::unordered_map<uint32_t, uint8_t> unicode_to_byte_;
  struct Regex;
  std::unique_ptr<Regex> regex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// DIR/encoder.json and DIR/vocab.bpe, as every command's --tokenizer names
// them; throws naming `--tokenizer 'DIR'` and where to get them when absent.
std::unique_ptr<GPT2Tokenizer> load_gpt2_tokenizer(const std::string& dir);

}  // namespace fsdp::data
