#include "fsdp/models/hf/config_reader.h"

#include <cmath>
#include <string_view>
#include <utility>

namespace fsdp::models::hf {

ConfigReader::ConfigReader(const nlohmann::json& config, std::string where, std::string family)
    : config_(config), where_(std::move(where)), family_(std::move(family)) {
  FSDP_CHECK(config_.is_object(), where_, ": config.json is not a JSON object");
  // Never architecture: provenance, token ids, generation and cache flags.
  // pad_token_id is not among them: the decoder families' embeddings take
  // it as their padding row (padding_row below); GPT-2 ignores it by name.
  ignore({"_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "bos_token_id",
          "eos_token_id", "use_cache", "initializer_range", "tokenizer_class", "output_attentions",
          "output_hidden_states", "return_dict", "dtype"});
}

bool ConfigReader::has(const char* key) const { return config_.contains(key) && !config_.at(key).is_null(); }

void ConfigReader::require_integer(const char* key, const nlohmann::json& value) const {
  FSDP_CHECK(value.is_number_integer(), where_, ": config.json field '", key, "' must be a whole number (got ",
             value.dump(), ")");
}

// [Note: dimension limits]
// A config.json is read before any weight: a hostile or corrupt one could
// ask for 2^40 layers, and building the modules alone would exhaust memory
// long before a weight is compared. Each dimension has a limit far above
// every published model (the largest have about 128 layers, 256 experts
// and widths under 32,768) and low enough that no product of them
// overflows 64 bits in the parameter counts (4,096 layers x 1,024 experts x
// 3 x 2^16 x 2^16 < 2^63).
namespace {
struct SizeLimit {
  const char* key;
  int64_t max;
};
constexpr SizeLimit kSizeLimits[] = {
    {"num_hidden_layers", 4096},      {"n_layer", 4096},
    {"num_attention_heads", 4096},    {"num_key_value_heads", 4096},
    {"n_head", 4096},                 {"hidden_size", 65536},
    {"n_embd", 65536},                {"head_dim", 65536},
    {"intermediate_size", 262144},    {"intermediate_size_mlp", 262144},
    {"moe_intermediate_size", 65536}, {"vocab_size", int64_t{1} << 24},
    {"num_experts", 1024},            {"num_local_experts", 1024},
    {"num_experts_per_tok", 1024},    {"n_positions", int64_t{1} << 24},
};
}  // namespace

int64_t ConfigReader::get_size(const char* key) {
  const auto n = get<int64_t>(key);
  int64_t max = int64_t{1} << 40;
  for (const auto& limit : kSizeLimits) {
    if (std::string_view(limit.key) == key) max = limit.max;
  }
  FSDP_CHECK(n >= 1 && n <= max, where_, ": config.json field '", key, "' is ", n, " (expected a size from 1 to ", max,
             n > max ? "; no published model comes near it: a corrupt or hostile config.json?)" : ")");
  return n;
}

double ConfigReader::get_positive_or(const char* key, double fallback) {
  const double v = get_or<double>(key, fallback);
  FSDP_CHECK(std::isfinite(v) && v > 0, where_, ": config.json field '", key, "' is ", v,
             " (expected a positive number)");
  return v;
}

double ConfigReader::get_probability_or(const char* key, double fallback) {
  const double v = get_or<double>(key, fallback);
  FSDP_CHECK(v >= 0 && v < 1, where_, ": config.json field '", key, "' is ", v, " (expected a probability, 0 <= p < 1)");
  return v;
}

int64_t ConfigReader::get_size_or(const char* key, int64_t fallback) {
  used_.insert(key);
  return has(key) ? get_size(key) : fallback;
}

std::optional<int64_t> ConfigReader::padding_row(int64_t vocab_size) {
  const nlohmann::json& id = raw("pad_token_id");
  if (id.is_null()) return std::nullopt;
  require_integer("pad_token_id", id);
  // nn.Embedding's rule: a negative index counts from the end, anything
  // else outside the vocabulary is refused.
  const auto value = id.get<int64_t>();
  FSDP_CHECK(value >= -vocab_size && value < vocab_size, where_, ": config.json field 'pad_token_id' is ", value,
             " (expected a token id from ", -vocab_size, " to ", vocab_size - 1,
             ", the embedding's padding row, or null for none)");
  return value < 0 ? vocab_size + value : value;
}

const nlohmann::json& ConfigReader::raw(const char* key) {
  used_.insert(key);
  static const nlohmann::json null;
  return has(key) ? config_.at(key) : null;
}

void ConfigReader::accept_only(const char* key, const nlohmann::json& implemented, const char* meaning) {
  used_.insert(key);
  if (!has(key)) return;
  FSDP_CHECK(config_.at(key) == implemented, where_, ": config.json sets '", key, "' to ", config_.at(key).dump(),
             " (", meaning, "), which is not implemented for ", family_, " (expected ", implemented.dump(), ")");
}

void ConfigReader::ignore(std::initializer_list<const char*> keys) {
  for (const char* k : keys) used_.insert(k);
}

void ConfigReader::finish() const {
  for (const auto& [key, value] : config_.items()) {
    // null is "not set" in Hugging Face's configs.
    FSDP_CHECK(used_.count(key) != 0 || value.is_null(), where_, ": config.json key '", key, "' (", value.dump(),
               ") is not known to the ", family_,
               " reader; it may change the architecture, so the model is refused rather than built without it");
  }
}

std::string dtype_from_torch_dtype(const nlohmann::json& config, const std::string& where) {
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!config.contains(key) || config.at(key).is_null()) continue;
    FSDP_CHECK(config.at(key).is_string(), where, ": config.json '", key, "' is not a string");
    const auto name = config.at(key).get<std::string>();
    if (name == "float32") return "F32";
    if (name == "bfloat16") return "BF16";
    if (name == "float16") return "F16";
    throw Error(where + ": config.json '" + key + "' is '" + name + "' (expected float32, bfloat16 or float16)");
  }
  return "F32";
}

std::string torch_dtype_name(const std::string& dtype) {
  if (dtype == "BF16") return "bfloat16";
  if (dtype == "F16") return "float16";
  return "float32";
}

std::string parse_export_dtype(const std::string& value, const std::string& flag) {
  if (value == "float32" || value == "fp32") return "F32";
  if (value == "bfloat16" || value == "bf16") return "BF16";
  if (value == "float16" || value == "fp16") return "F16";
  throw Error(flag + " '" + value + "' is not a dtype (expected float32, bfloat16 or float16)");
}

}  // namespace fsdp::models::hf
