#pragma once
// Building models by name (a preset) or from a Hugging Face directory, and
// moving weights in and out of Hugging Face's layout (config.json +
// model.safetensors).

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "fsdp/io/safetensors.h"
#include "fsdp/models/causal_lm.h"

namespace fsdp::models {

// Every preset name, for messages and `--model` help.
std::vector<std::string> preset_names();
// "gpt2-tiny (vocabulary 512), ...": every preset with its vocabulary size.
std::string preset_help();

// A preset (gpt2-*, llama*, example) with dropout applied where the
// architecture has it. Throws naming the closest preset for unknown names.
CausalLM build_preset(const std::string& name, double dropout = 0.0);

// The architecture a Hugging Face config.json describes (GPT2LMHeadModel,
// LlamaForCausalLM), including its *_pdrop fields. Throws naming the field
// that is missing or of the wrong type.
CausalLM build_from_hf_config(const nlohmann::json& config, const std::string& where);

// The checkpoint key of a parameter: our module tree mirrors Hugging
// Face's, so a fully qualified name is its key. The one place that says so.
std::string hf_key(const std::string& fqn);

// A Hugging Face directory's weights, memory-mapped, matched to a model's
// parameter names (GPT-2 files saved without the "transformer." prefix too).
class HfWeights {
 public:
  explicit HfWeights(const std::string& dir);
  ~HfWeights();
  // Throws naming the tensor that is missing, of the wrong shape, or extra.
  void validate(torch::nn::Module& model) const;
  // Fills `full` with the weights of parameter `fqn`.
  void fill(const std::string& fqn, torch::Tensor& full) const;
  const std::string& config_path() const { return config_path_; }

 private:
  std::string key_for(const std::string& fqn) const;
  std::string config_path_;
  std::unique_ptr<class io::SafetensorsFile> file_;
};

// The model DIR/config.json describes. With `deferred`, parameters are
// deferred (no memory) until fully_shard materialises them shard by shard.
CausalLM build_from_hf_dir(const std::string& dir, bool deferred);

// Builds the model in DIR/config.json and loads DIR/model.safetensors into
// it, whole, in this process (for generation). Throws naming the tensor that
// is missing or whose shape does not fit the config.
CausalLM load_hf_pretrained(const std::string& dir);

// Writes DIR/config.json and DIR/model.safetensors from full parameter
// values (fsdp::full_parameters on a sharded model), atomically.
void save_hf_pretrained(CausalLMImpl& model, const std::vector<std::pair<std::string, torch::Tensor>>& full_params,
                        const std::string& dir);

}  // namespace fsdp::models
