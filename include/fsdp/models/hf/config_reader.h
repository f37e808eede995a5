#pragma once
// Reading a Hugging Face config.json for one model family so that nothing
// in it is ignored by accident: every key is either read (it sets the
// architecture), accepted only at the value this code implements
// (`attention_bias: false`), or declared irrelevant to the architecture
// (token ids, `use_cache`). finish() refuses any other key by name: a key
// we do not know may change the model, and a silently different model is
// worse than an error.

#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"

namespace fsdp::models::hf {

class ConfigReader {
 public:
  // `where`: the file, for messages; `family`: the model_type being read.
  ConfigReader(const nlohmann::json& config, std::string where, std::string family);

  bool has(const char* key) const;  // present and not null
  // A required key of type T; throws naming it when missing or mistyped.
  template <typename T>
  T get(const char* key) {
    FSDP_CHECK(has(key), where_, ": config.json has no '", key, "' (", family_, " needs it)");
    return convert<T>(key);
  }
  template <typename T>
  T get_or(const char* key, T fallback) {
    if (!has(key)) {
      used_.insert(key);
      return fallback;
    }
    return convert<T>(key);
  }
  // A required dimension: a whole number in 1..2^40.
  int64_t get_size(const char* key);
  // An optional one: `fallback` when absent or null.
  int64_t get_size_or(const char* key, int64_t fallback);
  // An optional number that must be finite and above 0 (an epsilon, a
  // rotary base); `fallback` when absent or null.
  double get_positive_or(const char* key, double fallback);
  // An optional probability in [0, 1) (a dropout).
  double get_probability_or(const char* key, double fallback);
  // The raw value (marks the key read); null when absent.
  const nlohmann::json& raw(const char* key);
  // A key this code implements only at `implemented` (absent or null is
  // fine too); any other value is refused, naming `meaning`.
  void accept_only(const char* key, const nlohmann::json& implemented, const char* meaning);
  // pad_token_id as transformers' decoders take it, the embedding's
  // padding_idx (no gradient from the lookup, zero in a fresh model): a row
  // in [0, vocab_size), a negative id counting from the end; null or
  // absent: none. Throws naming a non-integer or out-of-range id.
  std::optional<int64_t> padding_row(int64_t vocab_size);
  // Keys that do not change the architecture.
  void ignore(std::initializer_list<const char*> keys);
  // Throws naming the first key neither read, accepted nor ignored.
  void finish() const;

  const std::string& where() const { return where_; }

 private:
  template <typename T>
  T convert(const char* key) {
    used_.insert(key);
    // nlohmann converts 1e300 to int64_t without a check (undefined
    // behaviour): integers must be written as integers.
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) require_integer(key, config_.at(key));
    if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      FSDP_CHECK(config_.at(key).is_array(), where_, ": config.json field '", key, "' is not a list");
      for (const auto& v : config_.at(key)) require_integer(key, v);
    }
    try {
      return config_.at(key).get<T>();
    } catch (const std::exception&) {
      throw Error(where_ + ": config.json field '" + key + "' has the wrong type (" + config_.at(key).dump() + ")");
    }
  }

  void require_integer(const char* key, const nlohmann::json& value) const;

  const nlohmann::json& config_;
  std::string where_, family_;
  std::set<std::string> used_;
};

// The dtype config.json's "torch_dtype" names ("float32", "bfloat16",
// "float16"), as the safetensors/LibTorch spelling: F32, BF16, F16.
// Absent means float32. Throws naming an unknown value.
std::string dtype_from_torch_dtype(const nlohmann::json& config, const std::string& where);
// "F32" -> "float32".
std::string torch_dtype_name(const std::string& dtype);
// Accepts float32 / fp32 / bfloat16 / bf16 / float16 / fp16 (flags); returns
// F32, BF16 or F16. Throws naming `flag` and the expected values.
std::string parse_export_dtype(const std::string& value, const std::string& flag);

}  // namespace fsdp::models::hf
