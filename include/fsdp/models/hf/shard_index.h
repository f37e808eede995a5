#pragma once
// Hugging Face's sharded weights: tensors spread over model-0000K-of-0000N
// .safetensors files named in model.safetensors.index.json ({"metadata":
// {"total_size": bytes}, "weight_map": {tensor: file}}). Planning which
// tensor goes in which file, and reading and writing the index, with no
// LibTorch.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fsdp::models::hf {

inline constexpr const char* kSingleFile = "model.safetensors";
inline constexpr const char* kIndexFile = "model.safetensors.index.json";
// save_pretrained's default max_shard_size.
inline constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;

struct ShardPlan {
  std::vector<std::string> files;  // one name when everything fits in one file
  std::vector<size_t> file_of;     // per tensor, an index into files
};

// save_pretrained's rule: tensors in order, a new file when the next tensor
// would take the current one past `max_bytes` (a tensor larger than the
// limit gets a file of its own).
ShardPlan plan_shards(const std::vector<int64_t>& tensor_bytes, int64_t max_bytes);

// The index for a plan of more than one file.
std::string index_json(const std::vector<std::string>& names, const ShardPlan& plan, int64_t total_bytes);

// The weight map of DIR/model.safetensors.index.json: tensor -> file name.
// Throws naming the file for invalid JSON, a missing weight_map, or a file
// name that is not a plain name inside DIR.
std::map<std::string, std::string> read_index(const std::string& path);

// "5GB" (10^9), "500MB", "2GiB" (2^30), "100KB", "12345" (bytes); throws
// naming `flag` otherwise, and for zero unless `allow_zero`.
int64_t parse_size(const std::string& value, const std::string& flag, bool allow_zero = false);

}  // namespace fsdp::models::hf
