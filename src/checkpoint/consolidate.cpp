// Whole parameters out of a checkpoint in one process: ParameterReader, and
// consolidate_to_safetensors (`fsdp ckpt export --format safetensors`).
#include "fsdp/checkpoint/checkpoint.h"

#include <filesystem>

#include "checkpoint/rank_files.h"
#include "fsdp/io/safetensors.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

using detail::for_each_piece;
using detail::kBufferFileRank;
using detail::RankFiles;

// Copies elements [begin, begin + out.numel()) of `tensor` (a saved
// parameter or moment, spread over rank files) into `out`.
void gather_range(RankFiles& files, const nlohmann::json& pieces, const std::string& tensor, int64_t begin,
                  const at::Tensor& out, const std::string& what) {
  for_each_piece(pieces, begin, out.numel(), what, [&](int rank, int64_t lo, int64_t hi, int64_t pb) {
    files.get(rank).read_range_into(tensor, lo - pb, out.narrow(0, lo - begin, hi - lo));
  });
}

}  // namespace

ParameterReader::ParameterReader(const std::string& checkpoint)
    : checkpoint_(checkpoint),
      meta_(read_metadata(checkpoint)),
      files_(std::make_unique<RankFiles>(checkpoint, meta_)) {}

ParameterReader::~ParameterReader() = default;

std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterReader::parameters() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;
  for (const auto& [name, p] : meta_["params"].items()) {
    params.emplace_back(name, p["shape"].get<std::vector<int64_t>>());
  }
  return params;
}

at::Tensor ParameterReader::read(const std::string& name, at::ScalarType dtype) {
  const auto& params = meta_["params"];
  FSDP_CHECK(params.contains(name), "checkpoint '", checkpoint_, "' has no parameter '", name, "'");
  at::Tensor full = at::empty(params[name]["shape"].get<std::vector<int64_t>>(), dtype);
  gather_range(*files_, params[name]["shards"], "model/" + name, 0, full.view({-1}), "parameter '" + name + "'");
  return full;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterReader::buffers() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  if (!meta_.contains("buffers")) return out;
  for (const auto& [name, b] : meta_["buffers"].items()) out.emplace_back(name, b["shape"].get<std::vector<int64_t>>());
  return out;
}

at::Tensor ParameterReader::read_buffer(const std::string& name) {
  FSDP_CHECK(meta_.contains("buffers") && meta_["buffers"].contains(name), "checkpoint '", checkpoint_,
             "' has no buffer '", name, "'");
  return files_->get(kBufferFileRank).view("buffer/" + name).clone();
}

void consolidate_to_safetensors(const std::string& checkpoint, const std::string& out) {
  FSDP_CHECK(!fs::exists(fs::symlink_status(out)), "'", out,
             "' exists; the consolidated safetensors file goes to a new path");
  ParameterReader reader(checkpoint);
  const auto& params = reader.metadata()["params"];
  std::vector<io::SafetensorsWriter::Spec> specs;
  for (const auto& [name, shape] : reader.parameters()) {
    const auto* dtype = params[name].contains("dtype") ? &params[name]["dtype"] : nullptr;
    const at::ScalarType saved = dtype != nullptr ? io::safetensors_dtype(dtype->get<std::string>()) : at::kFloat;
    specs.push_back({name, saved, shape});
  }
  const auto buffers = reader.buffers();
  std::vector<at::Tensor> buffer_values;
  for (const auto& [name, shape] : buffers) {
    buffer_values.push_back(reader.read_buffer(name));
    specs.push_back({name, buffer_values.back().scalar_type(), shape});
  }
  io::SafetensorsWriter writer(out, specs);
  const auto parameters = reader.parameters();
  for (size_t i = 0; i < parameters.size(); ++i) writer.write(reader.read(parameters[i].first, specs[i].dtype));
  for (const auto& value : buffer_values) writer.write(value);
  writer.commit();
}

}  // namespace fsdp::checkpoint
