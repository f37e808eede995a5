#pragma once
// The table of model families (family.h): building models by preset name
// or from a Hugging Face directory, and the Hugging Face config of a built
// model. Weights in and out of Hugging Face's layout are in hf/weights.h.

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "fsdp/models/causal_lm.h"
#include "fsdp/models/family.h"

namespace fsdp::models {

const std::vector<FamilySpec>& families();
// The family of a built model (model.family()).
const FamilySpec& family_of(const CausalLMImpl& model);
// The family a config.json's model_type names; throws naming the types
// that are supported.
const FamilySpec& family_for_hf_config(const nlohmann::json& config, const std::string& where);

// Every preset name, for messages and `--model` help.
std::vector<std::string> preset_names();
// "gpt2-tiny (vocabulary 512), ...": every preset with its vocabulary size.
std::string preset_help();

// A preset with dropout applied where the architecture has it, and
// `vocab_size` embedding rows when not 0 (the preset's otherwise). Throws
// naming the closest preset for unknown names.
CausalLM build_preset(const std::string& name, double dropout = 0.0, int64_t vocab_size = 0);

// The architecture a Hugging Face config.json describes, including its
// dropout fields and its torch_dtype (remembered as the export default).
// Throws naming the field that is missing, of the wrong type, or not
// implemented.
CausalLM build_from_hf_config(const nlohmann::json& config, const std::string& where);

// DIR/config.json, parsed; throws naming the file.
nlohmann::json read_hf_config(const std::string& dir);

// The model DIR/config.json describes. With `deferred`, parameters are
// deferred (no memory) until fully_shard materialises them shard by shard.
CausalLM build_from_hf_dir(const std::string& dir, bool deferred);

// The config.json of a built model, torch_dtype included.
nlohmann::json hf_config(const CausalLMImpl& model);

}  // namespace fsdp::models
