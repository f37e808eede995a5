// A safetensors file: refused with fsdp::Error, or opened with every
// tensor's bytes inside the file and readable.

#include <cstdint>

#include <ATen/ATen.h>

#include "fsdp/common/error.h"
#include "fsdp/io/safetensors.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fsdp::fuzz::InputFile file(data, size);
  try {
    fsdp::io::SafetensorsFile st(file.path());
    for (const auto& e : st.entries()) {
      const at::Tensor t = st.view(e.name);
      if (t.numel() > 0) {
        volatile uint8_t sink = static_cast<const uint8_t*>(t.data_ptr())[t.nbytes() - 1];
        (void)sink;
        (void)st.read_range(e.name, t.numel() - 1, 1);
      }
    }
  } catch (const fsdp::Error&) {
  }
  return 0;
}
