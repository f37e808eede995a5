#include "fsdp/models/hf/checkpoint_export.h"

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/error.h"
#include "fsdp/io/input_file.h"
#include "fsdp/models/registry.h"

namespace fsdp::models {

void export_checkpoint_hf(const std::string& checkpoint, const std::string& out_dir, const HfExportOptions& options) {
  checkpoint::ParameterReader reader(checkpoint);
  const nlohmann::json& meta = reader.metadata();
  FSDP_CHECK(!meta.value("hf_config", "").empty(), "checkpoint '", checkpoint,
             "' records no Hugging Face architecture to export to");
  const nlohmann::json config =
      io::parse_json(meta["hf_config"].get<std::string>(), "checkpoint '" + checkpoint + "': its recorded config.json");
  const auto& family = family_for_hf_config(config, "checkpoint '" + checkpoint + "'");
  const auto params = reader.parameters();
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;  // Hugging Face name, shape
  for (const auto& [name, shape] : params) tensors.emplace_back(family.hf_keys(name).front(), shape);
  // One full parameter at a time, assembled from its pieces.
  write_hf_dir(out_dir, config, tensors, [&](size_t i) { return reader.read(params[i].first); }, options);
}

}  // namespace fsdp::models
