// metadata.json of a checkpoint: refused with fsdp::Error, or accepted and
// then safe to read the way load, inspect and export read it.

#include <cstdint>
#include <string>

#include "fsdp/checkpoint/metadata.h"
#include "fsdp/common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto meta = fsdp::checkpoint::parse_metadata(text, "fuzz/metadata.json");
    (void)fsdp::checkpoint::trainer_state(meta);
    for (const auto& [name, p] : meta["params"].items()) {
      for (const auto& d : p["shape"]) (void)d.get<int64_t>();
      (void)p["adam_step"].get<int64_t>();
      for (const auto& s : p["shards"]) {
        (void)s["rank"].get<int>();
        (void)(s["begin"].get<int64_t>() + s["count"].get<int64_t>());
      }
    }
    for (const auto& f : meta["files"]) {
      (void)f["rank"].get<int>();
      (void)f["name"].get<std::string>();
      (void)f["bytes"].get<int64_t>();
      (void)f["crc32"].get<uint32_t>();
    }
  } catch (const fsdp::Error&) {
  }
  return 0;
}
