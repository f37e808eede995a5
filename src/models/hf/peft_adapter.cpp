#include "fsdp/models/hf/peft_adapter.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/io/atomic_file.h"
#include "fsdp/io/input_file.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/io/staged_dir.h"
#include "fsdp/models/hf/weights.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/lora.h"

namespace fsdp::models {
namespace {

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";
// PEFT's names: <kPrefix><Hugging Face layer>.lora_A.weight (and lora_B).
const std::string kPrefix = "base_model.model.";
const std::string kFirstFactor = ".lora_A.weight";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// PEFT declares lora_alpha an int: a whole alpha is written as one.
nlohmann::json number(double v) {
  if (std::floor(v) == v && std::fabs(v) < 1e15) return static_cast<int64_t>(v);
  return v;
}

// "base_model.model.<HF layer>.lora_A.weight" for our "<layer>.lora_A.weight".
std::string adapter_key(const FamilySpec& family, const std::string& name) {
  const auto at = name.find(".lora_");
  const std::string layer = name.substr(0, at);
  const std::string hf_weight = family.hf_keys(layer + ".weight").front();
  FSDP_CHECK(ends_with(hf_weight, ".weight"), "LoRA: layer '", layer, "' is named '", hf_weight,
             "' in Hugging Face's files, not '<module>.weight'");
  return kPrefix + hf_weight.substr(0, hf_weight.size() - 7) + name.substr(at);
}

}  // namespace

bool is_peft_adapter_file(const std::string& name) { return name == kConfigFile || name == kWeightsFile; }

void save_peft_adapter(const CausalLMImpl& model, const std::vector<std::pair<std::string, torch::Tensor>>& full_params,
                       const PeftAdapterInfo& info, const std::string& dir) {
  const auto& family = family_of(model);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::vector<std::string> targets;
  for (const auto& [name, value] : full_params) {
    if (!nn::is_lora_parameter(name)) continue;
    // The layer's Hugging Face name is its weight's, less ".weight".
    const std::string key = adapter_key(family, name);
    tensors.emplace_back(key, value.to(torch::kFloat).contiguous());
    if (ends_with(key, kFirstFactor)) {
      targets.push_back(key.substr(kPrefix.size(), key.size() - kPrefix.size() - kFirstFactor.size()));
    }
  }
  FSDP_CHECK(!targets.empty(), "LoRA export to '", dir, "': the model holds no adapters");
  namespace fs = std::filesystem;
  std::error_code ec;
  FSDP_CHECK(!fs::exists(dir, ec) || fs::is_directory(dir, ec), "export '", dir,
             "' is a file; expected a directory (or a path to create one at)");
  nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", info.base_model},
      {"r", info.rank},
      {"lora_alpha", number(info.alpha)},
      {"lora_dropout", info.dropout},
      {"target_modules", targets},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"modules_to_save", nullptr},
      {"use_rslora", false},
      {"use_dora", false},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
  };
  // [Note: an export is published whole]
  io::StagedDir staged(dir, "LoRA adapter export");
  io::write_safetensors(staged.path() + "/" + kWeightsFile, tensors, {{"format", "pt"}});
  io::write_file_atomically(staged.path() + "/" + kConfigFile, config.dump(2) + "\n");
  if (info.companions) info.companions(staged.path());
  // An earlier export's model weights would load as a model beside the adapter: they go.
  staged.publish([](const std::string& name) { return !is_weights_file(name) && name != "config.json"; });
}

void apply_peft_adapter(CausalLMImpl& model, const std::string& dir) {
  const std::string what = "LoRA adapter '" + dir + "'";
  const auto config = io::read_json_file(dir + "/" + kConfigFile, what + ": its " + kConfigFile);
  FSDP_CHECK(config.is_object() && config.value("peft_type", "") == "LORA", what, ": ", kConfigFile,
             " does not say peft_type LORA; expected a LoRA adapter as PEFT's save_pretrained writes it");
  FSDP_CHECK(config.contains("r") && config["r"].is_number_integer() && config["r"].get<int64_t>() > 0, what,
             ": r is ", config.value("r", nlohmann::json()).dump(), "; expected a positive rank");
  FSDP_CHECK(config.contains("lora_alpha") && config["lora_alpha"].is_number(), what, ": lora_alpha is ",
             config.value("lora_alpha", nlohmann::json()).dump(), "; expected a number");
  const auto& targets = config.value("target_modules", nlohmann::json());
  nn::LoraOptions options;
  options.rank = config["r"].get<int64_t>();
  options.alpha = config["lora_alpha"].get<double>();
  options.targets.clear();
  if (targets.is_string()) {
    FSDP_CHECK(targets.get<std::string>() == "all-linear", what, ": target_modules is the pattern ", targets.dump(),
               ", which is matched as a regular expression by PEFT; expected a list of module names or all-linear");
    options.targets.push_back("all-linear");
  } else {
    FSDP_CHECK(targets.is_array() && !targets.empty(), what, ": target_modules is ", targets.dump(),
               "; expected a list of module names");
    for (const auto& t : targets) {
      FSDP_CHECK(t.is_string() && !t.get<std::string>().empty(), what, ": target_modules holds ", t.dump(),
                 "; expected module names");
      const std::string name = t.get<std::string>();
      const std::string last = name.substr(name.rfind('.') + 1);  // the layer's own name
      if (std::find(options.targets.begin(), options.targets.end(), last) == options.targets.end()) {
        options.targets.push_back(last);
      }
    }
  }
  nn::add_lora(model, options);
  load_peft_adapter(model, dir, options.rank, options.alpha);
}

void load_peft_adapter(CausalLMImpl& model, const std::string& dir, int64_t rank, double alpha) {
  const std::string what = "LoRA adapter '" + dir + "'";
  const auto config = io::read_json_file(dir + "/" + kConfigFile, what + ": its " + kConfigFile);
  FSDP_CHECK(config.is_object() && config.value("peft_type", "") == "LORA", what, ": ", kConfigFile,
             " does not say peft_type LORA; expected a LoRA adapter as PEFT's save_pretrained writes it");
  FSDP_CHECK(config.contains("r") && config["r"].is_number_integer() && config["r"].get<int64_t>() == rank, what,
             " has rank r = ", config.value("r", nlohmann::json()).dump(), ", and --lora-rank is ", rank,
             ": give the adapter's rank");
  FSDP_CHECK(config.contains("lora_alpha") && config["lora_alpha"].is_number() &&
                 config["lora_alpha"].get<double>() == alpha,
             what, " has lora_alpha ", config.value("lora_alpha", nlohmann::json()).dump(), ", and --lora-alpha is ",
             alpha, ": give the adapter's alpha");
  for (const char* unsupported : {"use_dora", "use_rslora"}) {
    FSDP_CHECK(!config.value(unsupported, false), what, " sets ", unsupported, ", which this LoRA does not compute");
  }
  FSDP_CHECK(config.value("rank_pattern", nlohmann::json::object()).empty() &&
                 config.value("alpha_pattern", nlohmann::json::object()).empty(),
             what, " sets a rank or alpha per layer (rank_pattern, alpha_pattern), which this LoRA does not compute");
  io::SafetensorsFile file(dir + "/" + kWeightsFile);
  const auto& family = family_of(model);
  std::set<std::string> unused;
  for (const auto& e : file.entries()) unused.insert(e.name);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    if (!nn::is_lora_parameter(item.key())) continue;
    const std::string key = adapter_key(family, item.key());
    const auto* entry = file.find(key);
    FSDP_CHECK(entry != nullptr, what, " has no '", key, "' for layer '", item.key(),
               "': it adapts other layers than --lora-targets names");
    torch::Tensor value = file.view(key);
    FSDP_CHECK(value.sizes() == item.value().sizes(), what, ": '", key, "' has shape ", value.sizes(),
               ", and the model's adapter ", item.value().sizes());
    // Adapters are floating weights: an integer or boolean tensor would
    // convert silently, a NaN or infinity poison every step after.
    FSDP_CHECK(at::isFloatingType(value.scalar_type()), what, ": '", key, "' is ", value.scalar_type(),
               "; adapter weights are floating point (F32, BF16, F16)");
    FSDP_CHECK(value.numel() == 0 || at::isfinite(value).all().item<bool>(), what, ": '", key,
               "' holds a NaN or an infinity; a trained adapter is finite");
    item.value().copy_(value);
    unused.erase(key);
  }
  FSDP_CHECK(unused.empty(), what, " holds '", unused.empty() ? "" : *unused.begin(), "' (", unused.size(),
             " tensor(s) in all) for no adapter of this model: it adapts layers --lora-targets does not name");
}

}  // namespace fsdp::models
