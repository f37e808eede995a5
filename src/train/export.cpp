#include "fsdp/train/export.h"

#include <filesystem>
#include <map>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/models/hf/config_reader.h"
#include "fsdp/models/hf/shard_index.h"
#include "fsdp/models/hf/peft_adapter.h"
#include "fsdp/models/hf/weights.h"
#include "fsdp/nn/lora.h"
#include "fsdp/train/builders.h"

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

bool is_lora_checkpoint(const nlohmann::json& metadata) {
  if (!metadata.contains("config") || !metadata["config"].is_string() || metadata["config"].get<std::string>().empty()) {
    return false;
  }
  try {
    TrainConfig config;
    config.load_yaml_text(metadata["config"].get<std::string>(), "the checkpoint's configuration");
    return config.lora.rank > 0;
  } catch (const Error&) {
    return false;  // another version's configuration: export_checkpoint_hf says what it can
  }
}

std::string export_lora_checkpoint(const std::string& checkpoint, const std::string& out, bool merge,
                                   const models::HfExportOptions& options) {
  checkpoint::ParameterReader reader(checkpoint);
  const nlohmann::json& meta = reader.metadata();
  TrainConfig config;
  config.load_yaml_text(meta["config"].get<std::string>(), "checkpoint '" + checkpoint + "': its configuration");
  const std::string& base = config.model.init_from;
  FSDP_CHECK(!base.empty(), "checkpoint '", checkpoint, "' holds LoRA adapters on the preset ", config.model.name,
             ", whose base weights exist only in the run: resume the run (--ckpt-dir, the same --steps) with ",
             "--export-hf DIR; nothing was exported");
  FSDP_CHECK(std::filesystem::is_directory(base), "checkpoint '", checkpoint, "' holds LoRA adapters on the base '",
             base, "', which is not a directory here; nothing was exported");
  const nlohmann::json recorded = meta.contains("extra") ? meta["extra"].value("lora_base", nlohmann::json()) : nlohmann::json();
  if (!recorded.is_null()) {
    const nlohmann::json now = lora_base_identity(config);
    FSDP_CHECK(recorded.value("weights", nlohmann::json()) == now.value("weights", nlohmann::json()), "checkpoint '",
               checkpoint, "': its adapters were trained on the base ", recorded.dump(), ", and '", base,
               "' now holds other weights (", now.dump(), "); nothing was exported");
  }
  models::CausalLM model = models::load_hf_pretrained(base);
  nn::LoraOptions lora;
  lora.rank = config.lora.rank;
  lora.alpha = config.lora.alpha;
  lora.dropout = config.lora.dropout;
  lora.targets = config.lora_targets();
  nn::add_lora(*model, lora);
  // The checkpoint's parameters (the adapters; a checkpoint from before
  // they were saved alone holds the base too) over the model's.
  std::map<std::string, torch::Tensor> by_name;
  for (const auto& item : model->named_parameters()) by_name[item.key()] = item.value();
  int64_t adapters = 0;
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, shape] : reader.parameters()) {
      const auto it = by_name.find(name);
      FSDP_CHECK(it != by_name.end(), "checkpoint '", checkpoint, "' holds parameter '", name, "', which the base '",
                 base, "' with the run's LoRA adapters has not; nothing was exported");
      FSDP_CHECK(it->second.sizes().vec() == shape, "checkpoint '", checkpoint, "': parameter '", name,
                 "' has shape ", c10::IntArrayRef(shape), ", the model ", it->second.sizes(), "; nothing was exported");
      it->second.copy_(reader.read(name, it->second.scalar_type()));
      adapters += nn::is_lora_parameter(name);
    }
  }
  FSDP_CHECK(adapters > 0, "checkpoint '", checkpoint, "' holds no LoRA adapter; nothing was exported");
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (const auto& item : model->named_parameters()) params.emplace_back(item.key(), item.value().detach());
  if (!merge) {
    models::PeftAdapterInfo info;
    info.rank = config.lora.rank;
    info.alpha = config.lora.alpha;
    info.dropout = config.lora.dropout;
    info.base_model = base;
    info.companions = options.companions;
    models::save_peft_adapter(*model, params, info, out);
    return "a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors) on " + base;
  }
  models::save_hf_pretrained(*model, nn::merge_lora(params, lora.scale()), out, options);
  return "the model " + base + " with the LoRA adapters folded into its weights";
}

}  // namespace fsdp::train
