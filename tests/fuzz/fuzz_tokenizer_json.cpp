// A hostile tokenizer.json: refused with fsdp::Error, or read into a
// tokenizer that encodes and decodes a fixed text without failing in any
// other way.

#include <cstdint>
#include <string>

#include "fsdp/common/error.h"
#include "fsdp/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto t = fsdp::data::Tokenizer::from_tokenizer_json_text(text, "", "fuzz/tokenizer.json");
    const auto ids = t->encode("Hello, world! I'M 12345 caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac <|endoftext|>  \n\n");
    (void)t->decode(ids);
    (void)t->vocab_size();
  } catch (const fsdp::Error&) {
  }
  return 0;
}
