// A Hugging Face config.json read by each family's adapter: refused with
// fsdp::Error (naming the key), or accepted as a configuration whose
// derived sizes are safe to compute.

#include <algorithm>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/models/gpt2/config.h"
#include "fsdp/models/hf/config_reader.h"
#include "fsdp/models/llama/config.h"
#include "fsdp/models/llama4/config.h"
#include "fsdp/models/qwen3/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  using namespace fsdp::models;
  try {
    (void)gpt2_config_from_hf(j, "fuzz/config.json");
  } catch (const fsdp::Error&) {
  }
  for (auto* read : {llama_config_from_hf, qwen3_config_from_hf, qwen3_moe_config_from_hf}) {
    try {
      const auto c = read(j, "fuzz/config.json");
      (void)c.head_size();
      for (int64_t i = 0; i < 4; ++i) (void)c.moe.is_sparse(i);
    } catch (const fsdp::Error&) {
    }
  }
  for (auto* read : {llama4_text_config_from_hf, llama4_config_from_hf}) {
    try {
      const auto c = read(j, "fuzz/config.json");
      for (int64_t i = 0; i < std::min<int64_t>(4, c.text.num_hidden_layers); ++i) {
        (void)c.is_moe(i);
        (void)c.uses_rope(i);
        (void)c.is_chunked(i);
      }
    } catch (const fsdp::Error&) {
    }
  }
  try {
    (void)hf::dtype_from_torch_dtype(j, "fuzz/config.json");
  } catch (const fsdp::Error&) {
  }
  return 0;
}
