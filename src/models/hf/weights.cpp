#include "fsdp/models/hf/weights.h"

#include "fsdp/models/hf/peft_adapter.h"

#include <sys/stat.h>

#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/common/fault_point.h"
#include "fsdp/io/atomic_file.h"
#include "fsdp/io/staged_dir.h"
#include "fsdp/models/hf/config_reader.h"
#include "fsdp/models/registry.h"

namespace fsdp::models {

namespace fs = std::filesystem;

HfWeights::HfWeights(const std::string& dir) : dir_(dir), config_path_(dir + "/config.json") {
  const auto config = read_hf_config(dir);
  family_ = &family_for_hf_config(config, config_path_);
  const std::string index = dir + "/" + hf::kIndexFile;
  if (fs::exists(index)) {
    file_of_ = hf::read_index(index);
    std::set<std::string> named;
    for (const auto& [tensor, f] : file_of_) named.insert(f);
    for (const auto& f : named) {
      FSDP_CHECK(fs::is_regular_file(dir + "/" + f), "'", index, "' names '", f, "', which is not in '", dir, "'");
    }
  } else {
    FSDP_CHECK(fs::exists(dir + "/" + hf::kSingleFile), "'", dir, "' has neither ", hf::kSingleFile, " nor ",
               hf::kIndexFile);
    for (const auto& e : file(hf::kSingleFile).entries()) file_of_[e.name] = hf::kSingleFile;
  }
}

HfWeights::~HfWeights() = default;

const io::SafetensorsFile& HfWeights::file(const std::string& name) const {
  auto& slot = open_[name];
  if (!slot) slot = std::make_unique<io::SafetensorsFile>(dir_ + "/" + name);
  return *slot;
}

std::vector<std::string> HfWeights::mapped_files() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : open_) out.push_back(name);
  return out;
}

const io::SafetensorsEntry* HfWeights::locate(const std::string& fqn, std::string* key,
                                              const io::SafetensorsFile** in) const {
  for (const auto& candidate : family_->hf_keys(fqn)) {
    const auto it = file_of_.find(candidate);
    if (it == file_of_.end()) continue;
    const auto& f = file(it->second);
    const auto* entry = f.find(candidate);
    FSDP_CHECK(entry != nullptr, "'", dir_, "/", hf::kIndexFile, "' puts tensor '", candidate, "' in '", it->second,
               "', which does not hold it");
    *key = candidate;
    *in = &f;
    return entry;
  }
  return nullptr;
}

void HfWeights::validate(torch::nn::Module& model) const {
  std::set<std::string> used;
  std::set<const void*> seen;
  for (const auto& item : model.named_parameters()) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    std::string key;
    const io::SafetensorsFile* in = nullptr;
    const auto* entry = locate(item.key(), &key, &in);
    FSDP_CHECK(entry != nullptr, "'", dir_, "' has no tensor '", family_->hf_keys(item.key()).front(),
               "', which the architecture in ", config_path_, " needs");
    FSDP_CHECK(entry->shape == item.value().sizes().vec(), "'", in->path(), "': tensor '", key, "' has shape ",
               c10::IntArrayRef(entry->shape), " but ", config_path_, " implies ", item.value().sizes());
    FSDP_CHECK(at::isFloatingType(entry->dtype), "'", in->path(), "': tensor '", key, "' is ", entry->dtype,
               " (expected F32, BF16 or F16 weights)");
    used.insert(key);
  }
  for (const auto& [name, f] : file_of_) {
    if (used.count(name) != 0 || family_->ignored_hf_tensor(name)) continue;
    throw Error("'" + dir_ + "/" + f + "' holds tensor '" + name + "', which the architecture in " + config_path_ +
                " does not have");
  }
}

void HfWeights::fill(const std::string& fqn, torch::Tensor& full) const {
  std::string key;
  const io::SafetensorsFile* in = nullptr;
  const auto* entry = locate(fqn, &key, &in);
  FSDP_CHECK(entry != nullptr, "'", dir_, "' has no tensor for parameter '", fqn, "'");
  full.copy_(in->view(key));  // bf16 / fp16 -> the parameter's dtype
  // A NaN or Inf loaded here would only surface as non-finite losses, with
  // advice about learning rates: name the tensor and the file instead.
  if (at::isFloatingType(full.scalar_type())) {
    const int64_t bad = full.numel() - at::isfinite(full).sum().item<int64_t>();
    FSDP_CHECK(bad == 0, "'", in->path(), "': tensor '", key, "' (parameter '", fqn, "') holds ", bad,
               " non-finite value(s) (NaN or Inf) of ", full.numel(), "; the weights are damaged, so no training starts");
  }
}

CausalLM load_hf_pretrained(const std::string& dir) {
  HfWeights weights(dir);
  // Checked on a deferred model (no memory) first: a config.json that does
  // not fit the tensors is refused before its model is allocated.
  weights.validate(*build_from_hf_dir(dir, /*deferred=*/true));
  CausalLM model = build_from_hf_dir(dir, /*deferred=*/false);
  torch::NoGradGuard no_grad;
  std::set<const void*> seen;
  for (const auto& item : model->named_parameters()) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    torch::Tensor value = item.value();
    weights.fill(item.key(), value);
  }
  return model;
}

void write_hf_dir(const std::string& dir, nlohmann::json config,
                  const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors,
                  const std::function<at::Tensor(size_t)>& value_of, const HfExportOptions& options) {
  const std::string dtype_name =
      options.dtype.empty() ? hf::dtype_from_torch_dtype(config, dir + "/config.json") : options.dtype;
  const at::ScalarType dtype = io::safetensors_dtype(dtype_name);
  std::error_code ec;
  FSDP_CHECK(!fs::exists(dir, ec) || fs::is_directory(dir, ec), "export '", dir,
             "' is a file; expected a directory (or a path to create one at)");
  // [Note: an export is published whole]
  io::StagedDir staged(dir, "export");
  const std::string& out = staged.path();

  std::vector<int64_t> bytes;
  std::vector<std::string> names;
  int64_t total = 0;
  for (const auto& [name, shape] : tensors) {
    names.push_back(name);
    bytes.push_back(c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(dtype)));
    total += bytes.back();
  }
  const auto plan = hf::plan_shards(bytes, options.max_shard_bytes);
  for (size_t file = 0; file < plan.files.size(); ++file) {
    std::vector<io::SafetensorsWriter::Spec> specs;
    std::vector<size_t> members;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (plan.file_of[i] != file) continue;
      specs.push_back({tensors[i].first, dtype, tensors[i].second});
      members.push_back(i);
    }
    io::SafetensorsWriter writer(out + "/" + plan.files[file], specs, {{"format", "pt"}});
    for (const size_t i : members) writer.write(value_of(i).to(dtype));
    writer.commit();
    fault_point("export.weights_file_written");
  }
  if (plan.files.size() > 1) io::write_file_atomically(out + "/" + hf::kIndexFile, hf::index_json(names, plan, total));
  config["torch_dtype"] = hf::torch_dtype_name(dtype_name);
  io::write_file_atomically(out + "/config.json", config.dump(2) + "\n");
  if (options.companions) options.companions(out);
  // An earlier export's weights (one file then, shards now, or the
  // reverse) would contradict these; its other files carry over.
  // An adapter directory's files (a LoRA export there before) would make
  // transformers load the base and the old adapter instead of these.
  staged.publish([](const std::string& name) { return !is_weights_file(name) && !is_peft_adapter_file(name); });
}

bool is_weights_file(const std::string& name) {
  return name.rfind("model", 0) == 0 && name.find(".safetensors") != std::string::npos;
}

void save_hf_pretrained(const CausalLMImpl& model,
                        const std::vector<std::pair<std::string, torch::Tensor>>& full_params, const std::string& dir,
                        const HfExportOptions& options) {
  const auto& family = family_of(model);
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
  for (const auto& [name, value] : full_params) tensors.emplace_back(family.hf_keys(name).front(), value.sizes().vec());
  HfExportOptions o = options;
  if (o.dtype.empty()) o.dtype = model.hf_dtype;
  write_hf_dir(dir, hf_config(model), tensors, [&](size_t i) { return full_params[i].second; }, o);
}

}  // namespace fsdp::models
