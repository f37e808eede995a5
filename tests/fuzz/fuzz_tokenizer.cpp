// GPT-2's tokenizer on arbitrary bytes: encode refuses invalid UTF-8 with
// fsdp::Error or round-trips the text exactly; decode takes any ids.

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "fsdp/common/error.h"
#include "fsdp/data/gpt2_tokenizer.h"

namespace {
const fsdp::data::GPT2Tokenizer& tokenizer() {
  static std::unique_ptr<fsdp::data::GPT2Tokenizer> t = [] {
    const char* dir = std::getenv("FSDP_FUZZ_TOKENIZER");
    return fsdp::data::load_gpt2_tokenizer(dir != nullptr ? dir : FSDP_SOURCE_DIR "/data/gpt2");
  }();
  return *t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& t = tokenizer();
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto ids = t.encode(text);
    if (t.decode(ids) != text) std::abort();  // byte-level BPE loses nothing
  } catch (const fsdp::Error&) {
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 4 <= size; i += 4) {
    int32_t id;
    __builtin_memcpy(&id, data + i, 4);
    ids.push_back(id);
  }
  try {
    (void)t.decode(ids);
  } catch (const fsdp::Error&) {
  }
  return 0;
}
