// A YAML training config: refused with fsdp::Error, or loaded and valid.

#include <cstdint>
#include <string>

#include "fsdp/common/error.h"
#include "fsdp/train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    fsdp::train::TrainConfig config;
    config.load_yaml_text(text, "fuzz.yaml");
    config.validate();
    (void)config.to_yaml();
  } catch (const fsdp::Error&) {
  }
  return 0;
}
