#include "fsdp/train/export.h"


#include "fsdp/core/fully_shard.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/models/hf/config_reader.h"
#include "fsdp/models/hf/shard_index.h"
#include "fsdp/models/hf/peft_adapter.h"
#include "fsdp/models/hf/weights.h"
#include "fsdp/nn/lora.h"

namespace fsdp::train {
namespace {

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& n : names) text += (text.empty() ? "" : ", ") + n;
  return text;
}

}  // namespace

void export_trained_model(models::CausalLMImpl& model, const TrainConfig& config, const CompanionSources& sources,
                          dist::World& world, RunLog& log) {
  const TrainConfig::HfExport& r = config.hf_export;
  auto params = full_parameters(model);
  const bool lora = config.lora.rank > 0;
  if (lora && !r.merge_lora) {
    if (log.speaks()) {
      models::PeftAdapterInfo info;
      info.rank = config.lora.rank;
      info.alpha = config.lora.alpha;
      info.dropout = config.lora.dropout;
      info.base_model = config.model.init_from.empty() ? config.model.name : config.model.init_from;
      CompanionReport report;
      info.companions = [&](const std::string& staged) {
        report = write_hf_companions(sources, model.vocab_size(), staged);
      };
      models::save_peft_adapter(model, params, info, r.dir);
      log.say("exported the LoRA adapter to " + r.dir + " (PEFT's adapter_config.json and adapter_model.safetensors" +
              (report.written.empty() ? "" : ", with " + join(report.written)) + "); --merge-lora writes the model "
              "with the adapters folded in instead");
    }
    dist::barrier(world.group());
    return;
  }
  if (lora) params = nn::merge_lora(params, config.lora.alpha / static_cast<double>(config.lora.rank));
  if (log.speaks()) {
    models::HfExportOptions options;
    if (!r.dtype.empty()) options.dtype = models::hf::parse_export_dtype(r.dtype, "--export-dtype");
    options.max_shard_bytes = models::hf::parse_size(r.shard_size, "--export-shard-size");
    CompanionReport report;
    options.companions = [&](const std::string& staged) {
      report = write_hf_companions(sources, model.vocab_size(), staged);
    };
    models::save_hf_pretrained(model, params, r.dir, options);
    if (!report.note.empty()) {
      log.warn("no tokenizer in " + r.dir + ": " + report.note +
               "; give `fsdp generate --from` and AutoTokenizer a matching one");
    }
    log.say("exported Hugging Face weights to " + r.dir +
            (report.written.empty() ? "" : " (with " + join(report.written) + ")"));
  }
  dist::barrier(world.group());
}

}  // namespace fsdp::train
