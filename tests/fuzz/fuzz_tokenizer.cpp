// The byte-level BPE tokenizers on arbitrary bytes: GPT-2's files and, when
// fetched, Llama 3's tokenizer.json (added tokens, ignore_merges, its split
// pattern). encode refuses invalid UTF-8 with fsdp::Error or round-trips
// the text exactly; decode takes any ids.

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/common/error.h"
#include "fsdp/data/tokenizer.h"

namespace {
const std::vector<std::unique_ptr<fsdp::data::Tokenizer>>& tokenizers() {
  static const auto all = [] {
    std::vector<std::unique_ptr<fsdp::data::Tokenizer>> t;
    const char* dir = std::getenv("FSDP_FUZZ_TOKENIZER");
    t.push_back(fsdp::data::Tokenizer::from_dir(dir != nullptr ? dir : FSDP_SOURCE_DIR "/data/gpt2"));
    if (dir == nullptr && std::filesystem::exists(FSDP_SOURCE_DIR "/data/llama3/tokenizer.json")) {
      t.push_back(fsdp::data::Tokenizer::from_dir(FSDP_SOURCE_DIR "/data/llama3"));
    }
    return t;
  }();
  return all;
}
}  // namespace

// Loading Llama 3's tables takes seconds under the sanitizers; done here,
// before libFuzzer's per-input timeout starts, it is not charged to the
// first input.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 4 <= size; i += 4) {
    int32_t id;
    __builtin_memcpy(&id, data + i, 4);
    ids.push_back(id);
  }
  for (const auto& t : tokenizers()) {
    try {
      if (t->decode(t->encode(text)) != text) std::abort();  // byte-level BPE loses nothing
    } catch (const fsdp::Error&) {
    }
    try {
      (void)t->decode(ids);
    } catch (const fsdp::Error&) {
    }
  }
  return 0;
}
