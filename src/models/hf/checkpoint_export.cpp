#include "fsdp/models/hf/checkpoint_export.h"

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/error.h"
#include "fsdp/io/input_file.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/layers.h"
#include "fsdp/nn/lora.h"

namespace fsdp::models {
namespace {

// What resume checks, checked before anything is written: the checkpoint
// holds every parameter of the model its recorded config.json describes,
// in that model's shapes, and nothing else (a deferred model: no memory).
void check_parameters_fit(const std::string& checkpoint, const nlohmann::json& config,
                          const std::vector<std::pair<std::string, std::vector<int64_t>>>& saved) {
  CausalLM model = [&] {
    nn::DeferredInit deferred;
    return build_from_hf_config(config, "checkpoint '" + checkpoint + "': its recorded config.json");
  }();
  std::map<std::string, std::vector<int64_t>> expected;
  std::set<const void*> seen;
  for (const auto& item : model->named_parameters()) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) expected[item.key()] = item.value().sizes().vec();
  }
  for (const auto& [name, shape] : saved) {
    FSDP_CHECK(!nn::is_lora_parameter(name), "checkpoint '", checkpoint, "' holds LoRA adapters ('", name,
               "'), which `fsdp ckpt export` does not fold in yet; export the run with `fsdp train` instead: resume it "
               "(--ckpt-dir, the same --steps) with --export-hf DIR for a PEFT adapter, or with --merge-lora too for "
               "a plain model; nothing was exported");
    const auto it = expected.find(name);
    FSDP_CHECK(it != expected.end(), "checkpoint '", checkpoint, "' holds parameter '", name,
               "', which the model of its recorded config.json does not have; nothing was exported");
    FSDP_CHECK(it->second == shape, "checkpoint '", checkpoint, "': parameter '", name, "' has shape ",
               c10::IntArrayRef(shape), " but its recorded config.json implies ", c10::IntArrayRef(it->second),
               "; nothing was exported");
    expected.erase(it);
  }
  FSDP_CHECK(expected.empty(), "checkpoint '", checkpoint, "' lacks parameter '",
             expected.empty() ? "" : expected.begin()->first, "' (", expected.size(),
             " missing in all) of the model its recorded config.json describes; nothing was exported");
}

}  // namespace

void export_checkpoint_hf(const std::string& checkpoint, const std::string& out_dir, const HfExportOptions& options) {
  checkpoint::ParameterReader reader(checkpoint);
  const nlohmann::json& meta = reader.metadata();
  FSDP_CHECK(!meta.value("hf_config", "").empty(), "checkpoint '", checkpoint,
             "' records no Hugging Face architecture to export to");
  const nlohmann::json config =
      io::parse_json(meta["hf_config"].get<std::string>(), "checkpoint '" + checkpoint + "': its recorded config.json");
  const std::string where = "checkpoint '" + checkpoint + "'";
  const FamilySpec& family = family_for_hf_config(config, where);  // a named `where`: no dangling temporary
  const auto params = reader.parameters();
  check_parameters_fit(checkpoint, config, params);
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;  // Hugging Face name, shape
  for (const auto& [name, shape] : params) tensors.emplace_back(family.hf_keys(name).front(), shape);
  // One full parameter at a time, assembled from its pieces.
  write_hf_dir(out_dir, config, tensors, [&](size_t i) { return reader.read(params[i].first); }, options);
}

}  // namespace fsdp::models
