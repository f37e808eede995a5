#include "fsdp/train/export.h"

#include <filesystem>

#include "fsdp/core/fully_shard.h"
#include "fsdp/dist/collectives.h"
#include "fsdp/models/hf/config_reader.h"
#include "fsdp/models/hf/shard_index.h"
#include "fsdp/models/hf/weights.h"

namespace fsdp::train {

void export_trained_model(models::CausalLMImpl& model, const TrainConfig::HfExport& r, const std::string& tokenizer_dir,
                          const data::Tokenizer* tokenizer, dist::World& world, RunLog& log) {
  const auto params = full_parameters(model);
  if (log.speaks()) {
    models::HfExportOptions options;
    if (!r.dtype.empty()) options.dtype = models::hf::parse_export_dtype(r.dtype, "--export-dtype");
    options.max_shard_bytes = models::hf::parse_size(r.shard_size, "--export-shard-size");
    models::save_hf_pretrained(model, params, r.dir, options);
    // A tokenizer with more tokens than the model has rows would make an
    // inconsistent directory (ids the embedding cannot look up): left out.
    namespace fs = std::filesystem;
    const fs::path dir = tokenizer_dir;
    const bool has_json = fs::is_regular_file(dir / "tokenizer.json");
    std::unique_ptr<data::Tokenizer> loaded;
    if (tokenizer == nullptr && has_json) loaded = data::Tokenizer::from_dir(dir.string());
    const data::Tokenizer* tok = tokenizer != nullptr ? tokenizer : loaded.get();
    if (has_json && tok != nullptr && tok->vocab_size() > model.vocab_size()) {
      log.warn("the tokenizer " + tok->source() + " was not copied to " + r.dir + ": its " +
               std::to_string(tok->vocab_size()) + " tokens do not fit the model's vocabulary of " +
               std::to_string(model.vocab_size()) + "; give `fsdp generate --from` a matching --tokenizer");
    } else {
      for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
        if (fs::is_regular_file(dir / file) && !fs::equivalent(dir, r.dir)) {
          fs::copy_file(dir / file, fs::path(r.dir) / file, fs::copy_options::overwrite_existing);
        }
      }
    }
    log.say("exported Hugging Face weights to " + r.dir);
  }
  dist::barrier(world.group());
}

}  // namespace fsdp::train
