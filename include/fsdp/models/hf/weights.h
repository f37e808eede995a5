#pragma once
// Hugging Face weights in and out: a model directory's config.json with
// model.safetensors, or with model.safetensors.index.json and the shard
// files it names. Reading memory-maps each file the first time one of its
// tensors is needed and converts bf16/fp16 to the model's fp32; writing
// shards at a size limit, in a chosen dtype, atomically per file.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "fsdp/io/safetensors.h"
#include "fsdp/models/causal_lm.h"
#include "fsdp/models/family.h"
#include "fsdp/models/hf/shard_index.h"

namespace fsdp::models {

// A Hugging Face directory's weights matched to a model's parameter names
// through its family's adapter.
class HfWeights {
 public:
  explicit HfWeights(const std::string& dir);
  ~HfWeights();
  // Throws naming the tensor that is missing, of the wrong shape or dtype,
  // or extra (held by the files but not by the architecture).
  void validate(torch::nn::Module& model) const;
  // Fills `full` with the weights of parameter `fqn`, converted to its dtype.
  void fill(const std::string& fqn, torch::Tensor& full) const;
  const std::string& config_path() const { return config_path_; }
  // The adapter its config.json selected.
  const FamilySpec& family() const { return *family_; }
  // The weight files mapped so far (file names inside the directory).
  std::vector<std::string> mapped_files() const;

 private:
  const io::SafetensorsFile& file(const std::string& name) const;
  // The file and key of parameter `fqn`, or null when no candidate key exists.
  const io::SafetensorsEntry* locate(const std::string& fqn, std::string* key, const io::SafetensorsFile** in) const;

  std::string dir_, config_path_;
  const FamilySpec* family_;
  std::map<std::string, std::string> file_of_;  // tensor -> file name
  mutable std::map<std::string, std::unique_ptr<io::SafetensorsFile>> open_;
};

// Builds the model in DIR/config.json and loads its weights into it, whole,
// in this process (for generation and tests).
CausalLM load_hf_pretrained(const std::string& dir);

struct HfExportOptions {
  std::string dtype;  // F32, BF16, F16; empty: the model's hf_dtype (config.json's torch_dtype)
  int64_t max_shard_bytes = hf::kDefaultMaxShardBytes;
  // Writes the files that go beside the weights (tokenizer, generation
  // config) into the directory it is given, before the export is published.
  std::function<void(const std::string&)> companions;
};

// Whether NAME is a weights file of an export (model.safetensors, its
// shards, their index).
bool is_weights_file(const std::string& name);

// Writes DIR: config.json (torch_dtype set to the dtype written), the
// tensors, one file or shards with an index, and the companions, all into
// a directory beside DIR that then replaces it whole ([Note: an export is
// published whole]). value_of(i) gives tensor i (any floating dtype;
// converted). Of an earlier export in DIR, files other than weights that
// this one does not write carry over.
void write_hf_dir(const std::string& dir, nlohmann::json config,
                  const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors,
                  const std::function<at::Tensor(size_t)>& value_of, const HfExportOptions& options);

// write_hf_dir for a built model from its full parameter values
// (fsdp::full_parameters on a sharded model), named as its family names them.
void save_hf_pretrained(const CausalLMImpl& model,
                        const std::vector<std::pair<std::string, torch::Tensor>>& full_params, const std::string& dir,
                        const HfExportOptions& options = {});

}  // namespace fsdp::models
