#pragma once
// BPE tokenizers read from a Hugging Face tokenizer.json, or from GPT-2's
// original encoder.json and vocab.bpe. Two kinds: byte-level (GPT-2, Llama
// 3, Qwen: vocabulary, merges, the pre-tokenizer's split patterns, added
// tokens, NFC) and SentencePiece-style (Llama 2, Mistral: "▁" for spaces
// through the Prepend/Replace normalisers or the Metaspace pre-tokenizer,
// byte fallback, an unknown token, and the decoders that undo them).
// Pre-tokenisation patterns run on ICU with \s read as Unicode White_Space,
// as the reference engines (Oniguruma, Python's `regex`) read it. Light
// header.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fsdp::data {

struct TokenizerTables;  // vocabulary, merges, patterns: shared, read-only

class Tokenizer {
 public:
  // DIR/tokenizer.json (with DIR/tokenizer_config.json when present), else
  // DIR/encoder.json and DIR/vocab.bpe. Throws fsdp::Error naming the file
  // that is missing or malformed and any component it cannot honour.
  static std::unique_ptr<Tokenizer> from_dir(const std::string& dir);
  static std::unique_ptr<Tokenizer> from_tokenizer_json(const std::string& path, const std::string& config_path = "");
  // The same from the files' text; `where` names them in messages.
  static std::unique_ptr<Tokenizer> from_tokenizer_json_text(const std::string& tokenizer_json,
                                                             const std::string& tokenizer_config_json,
                                                             const std::string& where);
  // OpenAI's files: "<|endoftext|>" in the text is ordinary text there, as
  // in OpenAI's encoder; a tokenizer.json's added tokens are recognised.
  static std::unique_ptr<Tokenizer> from_gpt2_files(const std::string& encoder_json_path,
                                                    const std::string& vocab_bpe_path);

  explicit Tokenizer(std::shared_ptr<const TokenizerTables> tables);
  ~Tokenizer();

  // Valid UTF-8 text to ids, without the post-processor's template tokens
  // (Hugging Face's add_special_tokens=False): callers place separators.
  std::vector<int32_t> encode(const std::string& text) const;
  // Ids to text, as Hugging Face's decode(ids, skip_special_tokens=False):
  // added tokens decode to their text, ids with no token (a model's padding
  // rows) to nothing. Byte-level: the tokens' bytes (a sample may end inside
  // a multi-byte character). SentencePiece-style: the tokenizer's decoders,
  // which drop the space the encoder put before the text, and turn a run of
  // byte tokens that is not UTF-8 into one U+FFFD per byte.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The text `ids` add after `prompt` (a sample's continuation): as decode,
  // but a space the continuation starts with is kept, unless the prompt
  // ends with an added token (<s>), after which text starts anew.
  std::string decode_continuation(const std::vector<int32_t>& prompt, const std::vector<int32_t>& ids) const;
  // One more than the largest id, added tokens included.
  int32_t vocab_size() const;
  // The token `fsdp data prepare` puts before every document and an empty
  // prompt starts from: "<|endoftext|>" when the vocabulary has it (GPT-2,
  // Qwen), else tokenizer_config.json's bos_token (Llama 3:
  // <|begin_of_text|>; Llama 2, Mistral: <s>), else its eos_token. Throws
  // when there is none.
  int32_t document_separator() const;
  // Whether `id` is an added token marked special (<|im_end|>, <|eot_id|>,
  // </s>): a control token, not text (<think> is not).
  bool is_special(int32_t id) const;
  // The tokens Hugging Face's add_special_tokens=True puts before a text
  // (Llama's and Mistral's BOS; none for Qwen and GPT-2).
  const std::vector<int32_t>& template_prefix() const;
  // tokenizer_config.json's bos_token, eos_token, pad_token and unk_token
  // that are set, by name (none for GPT-2's original files).
  const std::map<std::string, std::string>& special_tokens() const;
  // What was read, for messages: "tokenizer.json in 'DIR'".
  const std::string& source() const;

  // Shares this tokenizer's tables with a fresh cache, for another thread.
  std::unique_ptr<Tokenizer> clone() const;

 private:
  std::vector<int32_t> encode_piece(const std::string& piece) const;
  std::string decode_tokens(const std::vector<int32_t>& ids, bool after_text) const;

  std::shared_ptr<const TokenizerTables> tables_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// GPT-2's two BPE files in DIR, (vocabulary, merges), under OpenAI's names
// (encoder.json, vocab.bpe) or Hugging Face's (vocab.json, merges.txt).
std::optional<std::pair<std::string, std::string>> gpt2_bpe_files(const std::string& dir);
// Whether DIR holds a tokenizer from_dir reads.
bool has_tokenizer(const std::string& dir);

// GPT-2's tokenizer as scripts/fetch_data.sh leaves it: data/gpt2 under the
// current directory, else under the repository the running `fsdp` was
// built in (its build folder's parent), so a run started elsewhere finds
// it. The current directory's path when neither holds one.
std::string default_tokenizer_dir();

}  // namespace fsdp::data
