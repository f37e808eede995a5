// metadata.json of a checkpoint: refused with fsdp::Error, or accepted and
// then safe to read the way load, inspect and export read it.

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/checkpoint/metadata.h"
#include "fsdp/common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto meta = fsdp::checkpoint::parse_metadata(text, "fuzz/metadata.json");
    (void)fsdp::checkpoint::trainer_state(meta);
    const int version = meta["version"].get<int>();
    for (const auto& [name, p] : meta["params"].items()) {
      for (const auto& d : p["shape"]) (void)d.get<int64_t>();
      if (version < 3) (void)p["adam_step"].get<int64_t>();
      for (const auto& s : p["shards"]) {
        (void)s["rank"].get<int>();
        (void)(s["begin"].get<int64_t>() + s["count"].get<int64_t>());
      }
    }
    const auto read_file_entry = [](const nlohmann::json& f) {
      (void)f["name"].get<std::string>();
      (void)f["bytes"].get<int64_t>();
      (void)f["crc32"].get<uint32_t>();
    };
    for (const auto& f : meta["files"]) {
      (void)f["rank"].get<int>();
      read_file_entry(f);
    }
    if (version >= 3) {
      // As load, inspect and export read version 3's parts: every name
      // they look up in params is there.
      const auto& params = meta["params"];
      for (const auto& [name, o] : meta["optimizers"].items()) {
        (void)o["kind"].get<std::string>();
        for (const auto& g : o["groups"]) {
          (void)g["options"].size();
          for (const auto& m : g["params"]) (void)params[m.get<std::string>()]["shards"];
        }
        for (const auto& [fqn, s] : o["state"].items()) {
          (void)params[fqn]["shards"];
          (void)s["step"].get<int64_t>();
          (void)s["tensors"].get<std::vector<std::string>>();
        }
      }
      for (const auto& [name, b] : meta["buffers"].items()) {
        for (const auto& d : b["shape"]) (void)d.get<int64_t>();
      }
      if (meta.contains("buffer_file")) read_file_entry(meta["buffer_file"]);
      (void)meta["states"].size();
    }
  } catch (const fsdp::Error&) {
  }
  return 0;
}
