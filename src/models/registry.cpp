#include "fsdp/models/registry.h"

#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/io/input_file.h"
#include "fsdp/common/suggest.h"
#include "fsdp/models/hf/config_reader.h"
#include "fsdp/nn/layers.h"

namespace fsdp::models {

// Each defined in its folder's family.cpp.
FamilySpec gpt2_family();
FamilySpec llama_family();
FamilySpec mistral_family();
FamilySpec qwen3_family();
FamilySpec qwen3_moe_family();
FamilySpec llama4_text_family();
FamilySpec llama4_family();
FamilySpec example_family();

const std::vector<FamilySpec>& families() {
  static const std::vector<FamilySpec> table = {
      gpt2_family(),      llama_family(),       mistral_family(), qwen3_family(),
      qwen3_moe_family(), llama4_text_family(), llama4_family(),  example_family(),
  };
  return table;
}

const FamilySpec& family_of(const CausalLMImpl& model) {
  const auto name = model.family();
  for (const auto& f : families()) {
    if (f.name == name) return f;
  }
  throw Error("model family '" + name + "' is not in the registry");
}

const FamilySpec& family_for_hf_config(const nlohmann::json& config, const std::string& where) {
  FSDP_CHECK(config.is_object(), where, ": config.json is not a JSON object");
  const nlohmann::json model_type = config.contains("model_type") ? config.at("model_type") : nlohmann::json();
  FSDP_CHECK(model_type.is_null() || model_type.is_string(), where, ": config.json 'model_type' is ", model_type.dump(),
             ": expected a name such as \"llama\"");
  const std::string type = model_type.is_string() ? model_type.get<std::string>() : "";
  std::vector<std::string> supported;
  for (const auto& f : families()) {
    if (!f.from_hf) continue;
    if (f.name == type) return f;
    supported.push_back(f.name);
  }
  throw Error(where + ": model_type '" + type + "' is not supported (expected " + join_words(supported) + ")");
}

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const auto& f : families()) out.insert(out.end(), f.presets.begin(), f.presets.end());
  return out;
}

std::string preset_help() {
  std::string out;
  for (const auto& f : families()) {
    for (const auto& name : f.presets) {
      out += (out.empty() ? "" : ", ") + name + " (vocabulary " + std::to_string(f.preset_vocab_size(name)) + ")";
    }
  }
  return out;
}

CausalLM build_preset(const std::string& name, double dropout, int64_t vocab_size) {
  for (const auto& f : families()) {
    for (const auto& preset : f.presets) {
      if (preset != name) continue;
      CausalLM model = f.build_preset(name, dropout);
      if (vocab_size == 0 || vocab_size == model->vocab_size()) return model;
      // Through the family's own config.json adapter: every size it
      // derives from the vocabulary (tied head, padded rows) follows.
      nlohmann::json config = hf_config(*model);
      config["vocab_size"] = vocab_size;
      CausalLM resized = build_from_hf_config(config, "model '" + name + "' with --vocab-size " + std::to_string(vocab_size));
      resized->hf_dtype = model->hf_dtype;
      return resized;
    }
  }
  // --model takes a preset; a Hugging Face model is read with --init-from.
  if (std::filesystem::is_regular_file(std::filesystem::path(name) / "config.json")) {
    throw Error("--model '" + name + "' is a Hugging Face model directory: train from it with --init-from " + name +
                " (--model names a preset)");
  }
  if (name.find('/') != std::string::npos) {
    throw Error("--model '" + name + "' is no preset nor a directory here; a Hugging Face hub id? fsdp.cpp reads " +
                "local directories: download it (hf download " + name + " --local-dir DIR) and use --init-from DIR");
  }
  const auto names = preset_names();
  throw Error("unknown model '" + name + "'" + did_you_mean(name, names) + "; presets: " + join_words(names) +
              " (a Hugging Face model directory goes to --init-from)");
}

CausalLM build_from_hf_config(const nlohmann::json& j, const std::string& where) {
  const auto& family = family_for_hf_config(j, where);
  auto model = family.from_hf(j, where);
  model->hf_dtype = hf::dtype_from_torch_dtype(j, where);
  return model;
}

nlohmann::json read_hf_config(const std::string& dir) {
  FSDP_CHECK(std::filesystem::is_directory(dir), "'", dir, "' is not a directory (expected a Hugging Face model directory)");
  return io::read_json_file(dir + "/config.json", "Hugging Face config");
}

CausalLM build_from_hf_dir(const std::string& dir, bool deferred) {
  const auto config = read_hf_config(dir);
  std::optional<nn::DeferredInit> guard;
  if (deferred) guard.emplace();
  return build_from_hf_config(config, dir + "/config.json");
}

nlohmann::json hf_config(const CausalLMImpl& model) {
  auto j = family_of(model).to_hf(model);
  j["torch_dtype"] = hf::torch_dtype_name(model.hf_dtype);
  return j;
}

}  // namespace fsdp::models
