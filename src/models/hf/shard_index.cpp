#include "fsdp/models/hf/shard_index.h"

#include <cctype>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/io/input_file.h"

namespace fsdp::models::hf {

ShardPlan plan_shards(const std::vector<int64_t>& tensor_bytes, int64_t max_bytes) {
  FSDP_CHECK(max_bytes > 0, "the shard size limit must be positive (got ", max_bytes, ")");
  ShardPlan plan;
  size_t count = 0;
  int64_t current = 0;
  for (const int64_t bytes : tensor_bytes) {
    if (count == 0 || (current > 0 && current + bytes > max_bytes)) {
      ++count;
      current = 0;
    }
    current += bytes;
    plan.file_of.push_back(count - 1);
  }
  if (count <= 1) {
    plan.files = {kSingleFile};
    return plan;
  }
  for (size_t i = 0; i < count; ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, count);
    plan.files.emplace_back(name);
  }
  return plan;
}

std::string index_json(const std::vector<std::string>& names, const ShardPlan& plan, int64_t total_bytes) {
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < names.size(); ++i) weight_map[names[i]] = plan.files[plan.file_of[i]];
  return nlohmann::json{{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}}.dump(2) + "\n";
}

std::map<std::string, std::string> read_index(const std::string& path) {
  const nlohmann::json j = io::read_json_file(path, "shard index");
  FSDP_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "'", path,
             "' has no \"weight_map\" object (expected Hugging Face's model.safetensors.index.json)");
  std::map<std::string, std::string> out;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    FSDP_CHECK(file.is_string(), "'", path, "': the file of tensor '", tensor, "' is not a string");
    const auto name = file.get<std::string>();
    FSDP_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..", "'", path,
               "': tensor '", tensor, "' is in '", name, "', which is not a file name inside the model directory");
    out[tensor] = name;
  }
  return out;
}

int64_t parse_size(const std::string& value, const std::string& flag, bool allow_zero) {
  size_t digits = 0;
  while (digits < value.size() && std::isdigit(static_cast<unsigned char>(value[digits]))) ++digits;
  const std::string unit = value.substr(digits);
  static const std::map<std::string, int64_t> units = {
      {"", 1},           {"B", 1},          {"KB", 1000},        {"MB", 1000'000}, {"GB", 1000'000'000},
      {"KiB", 1LL << 10}, {"MiB", 1LL << 20}, {"GiB", 1LL << 30}};
  const auto it = units.find(unit);
  FSDP_CHECK(digits > 0 && digits <= 12 && it != units.end(), flag, " '", value,
             "' is not a size (expected a number with an optional unit: 5GB, 500MB, 2GiB, 100KB)");
  const int64_t n = std::stoll(value.substr(0, digits));
  FSDP_CHECK(n > 0 || allow_zero, flag, " must be positive (got '", value, "')");
  FSDP_CHECK(n <= (int64_t{1} << 50) / it->second, flag, " '", value, "' is more than a pebibyte");
  return n * it->second;
}

}  // namespace fsdp::models::hf
