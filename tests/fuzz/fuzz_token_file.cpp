// A token file (llm.c headers, our own): refused with fsdp::Error, or
// opened and every token readable.

#include <cstdint>
#include <vector>

#include "fsdp/common/error.h"
#include "fsdp/data/token_file.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fsdp::fuzz::InputFile file(data, size);
  try {
    fsdp::data::TokenFile tokens(file.path());
    const int64_t n = tokens.size();
    std::vector<int64_t> out(static_cast<size_t>(std::min<int64_t>(n, 4096)));
    if (!out.empty()) tokens.read(0, static_cast<int64_t>(out.size()), out.data());
    if (n > 0) tokens.read(n - 1, 1, out.data());
  } catch (const fsdp::Error&) {
  }
  return 0;
}
