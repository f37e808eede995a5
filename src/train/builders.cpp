#include "fsdp/train/builders.h"

#include <filesystem>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <set>

#include "fsdp/checkpoint/metadata.h"
#include "fsdp/common/deferred_tensor.h"
#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/data/mixture.h"
#include "fsdp/data/token_file.h"
#include "fsdp/data/tokenizer_record.h"
#include "fsdp/models/hf/peft_adapter.h"
#include "fsdp/models/parallelize.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/lora.h"
#include "fsdp/io/safetensors.h"

namespace fsdp::train {

namespace {

// Module::to would materialise a deferred parameter (one element seen
// through zero strides) as a full tensor of one uninitialised value that no
// longer reads as deferred, so fully_shard would skip its param_init and
// every rank would hold the whole model. A deferred parameter moves as a
// deferred one; the rest move as Module::to moves them.
void move_keeping_deferred(torch::nn::Module& module, const at::Device& device) {
  for (auto& p : module.parameters()) {
    if (is_deferred(p)) {
      p.set_data(at::empty_strided(p.sizes(), std::vector<int64_t>(p.dim(), 0), p.options().device(device)));
    } else {
      p.set_data(p.to(device));
    }
  }
  for (auto& b : module.buffers()) b.set_data(b.to(device));
}

}  // namespace
namespace {

// For a token id a preset's vocabulary cannot hold: the flag that resizes
// it, and the presets whose vocabulary already holds it (the first, the
// smallest, of each vocabulary).
std::string preset_vocab_advice(int64_t max_id) {
  std::string fitting;
  std::set<int64_t> named;
  for (const auto& family : models::families()) {
    for (const auto& preset : family.presets) {
      const int64_t vocab = family.preset_vocab_size(preset);
      if (vocab <= max_id || !named.insert(vocab).second) continue;
      fitting += (fitting.empty() ? "" : ", ") + preset + " (vocabulary " + std::to_string(vocab) + ")";
    }
  }
  // Past every vocabulary of a supported family by far (an id read from a
  // damaged file, or from a file of 4-byte ids read as 2-byte ones): more
  // rows would not help.
  if (max_id >= (int64_t{1} << 24)) {
    return "no model has a vocabulary that large: the file is damaged, or not a token file of this format";
  }
  const int64_t rows = (max_id + 1 + 63) / 64 * 64;
  return "give the preset more embedding rows (--vocab-size " + std::to_string(rows) + ")" +
         (fitting.empty() ? "" : ", or choose a preset that holds it: " + fitting);
}

}  // namespace

torch::ScalarType precision_dtype(Precision p) {
  switch (p) {
    case Precision::kBf16: return torch::kBFloat16;
    case Precision::kFp16: return torch::kHalf;
    case Precision::kFp32: break;
  }
  return torch::kFloat;
}

namespace {

// LoRA: adapters on the targeted layers, every other parameter frozen.
// Under a bf16 policy the frozen ones are kept in bf16 (what they are
// gathered in anyway): no fp32 copy of a weight that never changes, so a
// rank holds half the base's bytes; the adapters keep fp32 masters.
}  // namespace

void keep_frozen_in_compute_dtype(models::CausalLMImpl& model, const TrainConfig& config) {
  const auto frozen_dtype = precision_dtype(config.runtime.precision);
  if (frozen_dtype == torch::kFloat) return;
  for (auto& p : model.parameters()) {
    if (p.requires_grad()) continue;
    p.set_data(is_deferred(p) ? at::empty_strided(p.sizes(), std::vector<int64_t>(p.dim(), 0), p.options().dtype(frozen_dtype))
                              : p.to(frozen_dtype));
  }
}

namespace {

void add_lora_adapters(models::CausalLMImpl& model, const TrainConfig& config, BuiltModel& built, RunLog& log) {
  const auto& l = config.lora;
  FSDP_CHECK(model.family() != "gpt2", "--lora-rank: GPT-2's projections are Conv1D layers (weights stored in x out), "
             "which LoRA here does not adapt; the Llama, Mistral, Qwen3 and Llama 4 families' are Linear layers");
  nn::LoraOptions o;
  o.rank = l.rank;
  o.alpha = l.alpha;
  o.dropout = l.dropout;
  o.targets = config.lora_targets();
  const auto layers = nn::add_lora(model, o);
  if (!l.init_from.empty()) models::load_peft_adapter(model, l.init_from, l.rank, l.alpha);
  keep_frozen_in_compute_dtype(model, config);
  const auto frozen_dtype = precision_dtype(config.runtime.precision);
  int64_t trainable = 0;
  for (const auto& p : unique_parameters(model)) trainable += p.requires_grad() ? p.numel() : 0;
  built.parameters = models::count_parameters(model);
  char share[32], alpha[32];
  std::snprintf(share, sizeof(share), "%.2f%%", 100.0 * static_cast<double>(trainable) / static_cast<double>(built.parameters));
  std::snprintf(alpha, sizeof(alpha), "%g", l.alpha);
  std::set<std::string> kinds;
  for (const auto& name : layers) kinds.insert(name.substr(name.rfind('.') + 1));
  std::string kind_list;
  for (const auto& k : kinds) kind_list += (kind_list.empty() ? "" : ",") + k;
  log.say("LoRA rank " + std::to_string(l.rank) + ", alpha " + alpha +
          " on " + std::to_string(layers.size()) + " layers (" + kind_list + "): " + std::to_string(trainable) +
          " trainable parameters (" + share + "), the other " + std::to_string(built.parameters - trainable) +
          " frozen" + (frozen_dtype != torch::kFloat ? " and kept in " + name_of(config.runtime.precision) : "") +
          (l.init_from.empty() ? "" : "; the adapters start from " + l.init_from));
}

}  // namespace

BuiltModel build_model(const TrainConfig& config, const dist::World& world, RunLog& log) {
  const TrainConfig::Model& m = config.model;
  BuiltModel built;
  if (m.init_from.empty()) {
    built.model = models::build_preset(m.name, m.dropout, m.vocab_size);
  } else {
    FSDP_CHECK(m.vocab_size == 0, "--vocab-size resizes a preset; --init-from '", m.init_from,
               "' takes its vocabulary from its config.json");
    // Deferred: no rank holds the whole model; fully_shard reads each
    // parameter from the memory-mapped file and keeps its shard.
    built.model = models::build_from_hf_dir(m.init_from, /*deferred=*/true);
    built.init_weights = std::make_shared<models::HfWeights>(m.init_from);
    built.init_weights->validate(*built.model);
  }
  auto& model = *built.model;
  // The world's device decision; FSDP's buffers follow the parameters.
  if (!world.device().is_cpu()) move_keeping_deferred(model, world.device());
  built.parameters = models::count_parameters(model);
  const int64_t params = built.parameters;
  log.say("model " + (m.init_from.empty() ? m.name : m.init_from) + ": " + std::to_string(params) + " parameters (" +
          model.family() + "), " + std::to_string(model.n_layers()) + " layers, width " + std::to_string(model.dim()) +
          ", vocabulary " + std::to_string(model.vocab_size()));
  if (built.init_weights && !built.init_weights->family().partial_load_note.empty()) {
    log.say("note: '" + m.init_from + "' " + built.init_weights->family().partial_load_note);
  }
  if (config.lora.rank > 0) add_lora_adapters(model, config, built, log);
  if (m.print && log.speaks()) {
    std::cout << model << "\n";
    for (const auto& item : model.named_parameters()) {
      std::cout << "  " << item.key() << "  " << item.value().sizes() << "  " << item.value().numel() << "\n";
    }
    std::cout << "  total  " << built.parameters << " parameters\n";
  }
  return built;
}

namespace {

// The tokenizer that made the token files in SOURCE (the
// tokenizer_record.json beside each), the same for every file that has one
// and checked against --init-from's; "" when no file carries a record.
std::string check_data_tokenizer(const TrainConfig& config, const std::string& source, const std::string& flag) {
  const auto files = data::expand_token_paths(data::mixture_paths(source, flag), flag);
  std::optional<data::TokenizerRecord> record;
  std::string recorded_file, unrecorded_file;
  for (const auto& file : files) {
    const auto beside = data::tokenizer_record_beside(file);
    if (!beside) {
      if (unrecorded_file.empty()) unrecorded_file = file;
      continue;
    }
    if (!record) {
      record = beside;
      recorded_file = file;
      continue;
    }
    FSDP_CHECK(beside->fingerprint == record->fingerprint || config.data.allow_tokenizer_mismatch, flag, " '", source,
               "' mixes token files of two tokenizers: '", recorded_file, "' was tokenized by ", record->source, " (",
               record->vocab_size, " tokens), '", file, "' by ", beside->source, " (", beside->vocab_size,
               " tokens), so the same ids mean different text in one stream. Give files of one tokenizer, or pass "
               "--allow-tokenizer-mismatch if this is intended");
  }
  if (!record) return "";
  // A file with no record beside files that have one: its tokenizer is
  // unknown, and the data line would name the others' as if it were its.
  FSDP_CHECK(unrecorded_file.empty() || config.data.allow_tokenizer_mismatch, flag, " '", source, "': '",
             unrecorded_file, "' has no ", data::kTokenizerRecordFile, " beside it, while '", recorded_file,
             "' was tokenized by ", record->source, " (", record->vocab_size, " tokens): one stream would mix a file "
             "of unknown tokenizer with them. Prepare it with `fsdp data prepare` (which records its tokenizer), "
             "give it on its own, or pass --allow-tokenizer-mismatch if this is intended");
  // The tokenizer the run's text goes through: --init-from's, else the one
  // --tokenizer names for a preset's samples.
  const std::string& init_from = config.model.init_from;
  const bool from_model = !init_from.empty() && data::has_tokenizer(init_from);
  const std::string tokenizer_dir = from_model ? init_from : config.sample.tokenizer;
  const std::string whose = from_model ? "--init-from's " : "--tokenizer's ";
  if (!tokenizer_dir.empty() && !config.data.allow_tokenizer_mismatch) {
    const auto model_tokenizer = data::record_of(*data::Tokenizer::from_dir(tokenizer_dir));
    FSDP_CHECK(model_tokenizer.fingerprint == record->fingerprint, flag, " '", source, "' was tokenized by ",
               record->source, " (", record->vocab_size, " tokens), not by ", whose, model_tokenizer.source, " (",
               model_tokenizer.vocab_size, " tokens): its ids mean other text to this model. Prepare the data with "
               "`fsdp data prepare --tokenizer ", tokenizer_dir, "`, or pass --allow-tokenizer-mismatch if this is "
               "intended");
  }
  return record->source + " (" + std::to_string(record->vocab_size) + " tokens)";
}

}  // namespace

std::unique_ptr<data::DataLoader> build_loader(TrainConfig& config, const models::CausalLMImpl& model,
                                               const dist::World& world, bool validation, RunLog& log) {
  const auto& d = config.data;
  FSDP_CHECK(d.seq_len <= model.max_seq_len(), "data.seq_len ", d.seq_len, " exceeds the model's ",
             model.max_seq_len(), " positions");
  const int64_t per_step = config.tokens_per_step(world.size());
  data::LoaderOptions o;
  o.batch_size = d.batch_size;
  o.seq_len = d.seq_len;
  o.rank = world.rank();
  o.world = world.size();
  o.device = world.device();
  o.grad_accum = validation ? 1 : static_cast<int>(d.grad_accum);
  o.vocab_size = model.vocab_size();
  o.seed = static_cast<uint64_t>(config.runtime.seed) + (validation ? 7919 : 0);
  o.shuffle = d.shuffle && !validation;
  o.pack = d.pack;
  FSDP_CHECK(!d.pack || model.supports_packed_rows(), "--pack: the ", model.family(), " family's model does not "
             "restart positions inside a row (its positions or attention are not per token); train it unpacked");
  if (validation) o.flag = "--val-data";
  if (config.model.init_from.empty()) o.vocab_advice = preset_vocab_advice;
  const std::string& source = validation ? d.val : d.train;
  auto loader = std::make_unique<data::DataLoader>(source, o);
  const char* flag = validation ? "--val-data" : "--data";
  if (config.objective.name == ObjectiveKind::kDpo) {
    FSDP_CHECK(loader->preference_pairs(), "--objective dpo trains on preference pairs, and ", flag, " '", source,
               "' holds ", loader->examples() > 0 ? "chat examples" : "a token stream", "; prepare {\"prompt\", ",
               "\"chosen\", \"rejected\"} records with `fsdp data prepare`");
  } else {
    FSDP_CHECK(!loader->preference_pairs(), flag, " '", source, "' holds preference pairs (a chosen and a rejected ",
               "answer to each prompt), which train with --objective dpo");
  }
  // The data's rows: examples, or windows of T tokens (+1 for the last target).
  const int64_t rows_in_data = loader->synthetic()     ? 0
                               : loader->examples() > 0 ? loader->rows()
                                                        : std::max<int64_t>(1, (loader->tokens_in_files() - 1) / d.seq_len);
  const int64_t rows_per_step = per_step / d.seq_len;
  if (!validation && config.runtime.epochs > 0) {
    const double steps = std::ceil(config.runtime.epochs * static_cast<double>(rows_in_data) /
                                   static_cast<double>(rows_per_step));
    FSDP_CHECK(steps <= 1e15, "--epochs ", config.runtime.epochs, " of ", rows_in_data, " rows at ", rows_per_step,
               " rows per step is more steps than a run makes");
    config.runtime.steps = std::max<int64_t>(1, static_cast<int64_t>(steps));
  }
  FSDP_CHECK(validation || config.runtime.steps <= checkpoint::kMaxCheckpointCount / per_step, "--steps ",
             config.runtime.steps, " at ", per_step, " tokens per step would count more than 2^62 tokens, past what a "
             "checkpoint records; expected at most ", checkpoint::kMaxCheckpointCount / per_step, " steps");
  std::string what =
      loader->synthetic()
          ? "synthetic (random tokens, seeded: a smoke test with nothing to learn)"
          : source + " (" + std::to_string(loader->files()) + " file(s), " + std::to_string(loader->tokens_in_files()) +
                " tokens)";
  if (!loader->synthetic()) {
    const auto made_by = check_data_tokenizer(config, source, validation ? "--val-data" : "--data");
    if (!made_by.empty()) what += ", tokenized by " + made_by;
  }
  if (loader->sources() > 1) {
    std::string shares;
    for (const auto& part : data::parse_mixture(source, flag)) {
      char share[32];
      std::snprintf(share, sizeof(share), " %.1f%%", 100.0 * part.weight);
      shares += (shares.empty() ? "" : ", ") + part.source + share;
    }
    what += "; mixed: " + shares + " of the sequences, interleaved in periods of " +
            std::to_string(data::MixtureSchedule::kPeriod);
  }
  if (loader->examples() > 0) {
    // Chat data: one example a row, cut to a row when longer.
    what += "; " + (loader->preference_pairs() ? std::to_string(loader->rows()) + " preference pairs, two rows each (" : std::string()) +
            std::to_string(loader->examples()) + " chat examples, " +
            (loader->packed() ? "packed into " + std::to_string(loader->rows()) + " rows of " + std::to_string(d.seq_len) +
                                    " tokens (attention kept inside each)"
                              : std::string("one a row")) +
            ", the loss on their answers; the longest has " + std::to_string(loader->longest_example()) + " tokens";
    if (const int64_t cut = loader->examples_longer_than_a_row(); cut > 0) {
      what += "; " + std::to_string(cut) + " longer than data.seq_len + 1 (" + std::to_string(d.seq_len + 1) +
              ") are cut to their first " + std::to_string(d.seq_len + 1) + " tokens (raise --seq-len to keep them whole)";
    }
    // Answers cut away train nothing: a run where no example trains a
    // token would report a loss of 0 and export the model unchanged.
    const int64_t idle = loader->examples_training_nothing_in_a_row();
    FSDP_CHECK(idle < loader->examples(), validation ? "--val-data" : "--data", " '", source, "': at --seq-len ",
               d.seq_len, " no example keeps a trained token (every answer starts past the first ", d.seq_len + 1,
               " tokens, where each row is cut): nothing would train. Raise --seq-len (the longest example has ",
               loader->longest_example(), " tokens)");
    if (idle > 0) {
      log.warn(std::to_string(idle) + " of " + std::to_string(loader->examples()) + " chat examples in '" + source +
               "' train no token at --seq-len " + std::to_string(d.seq_len) + " (their answers start past the cut); " +
               "micro-batches of only those weigh nothing. Raise --seq-len to train them");
    }
  }
  if (!validation && !loader->synthetic()) {
    // How many times the run goes over the data's rows.
    const double epochs = static_cast<double>(rows_per_step) * static_cast<double>(config.runtime.steps) /
                          static_cast<double>(rows_in_data);
    char text[64];
    std::snprintf(text, sizeof(text), "%.2f", epochs);
    what += "; " + std::string(text) + " epochs in " + std::to_string(config.runtime.steps) + " steps of " +
            std::to_string(rows_per_step) + " rows (the data holds " + std::to_string(rows_in_data) + ")" +
            (config.runtime.epochs > 0 ? " (--epochs)" : "");
  }
  if (validation && !loader->synthetic()) {
    // One evaluation reads eval.batches batches of B rows on each of W ranks.
    const int64_t rows = config.eval.batches * d.batch_size * world.size();
    const int64_t held = rows_in_data;
    if (config.eval.batches == 0) {
      const int64_t per_batch = d.batch_size * world.size();
      what += "; each evaluation scores all " + std::to_string(held) + " rows once, in " +
              std::to_string((held + per_batch - 1) / per_batch) + " batches (--eval-batches all)";
    } else if (held < rows) {
      log.warn("the validation data holds " + std::to_string(held) + (loader->packed() ? " packed rows" : loader->examples() > 0 ? " examples" : " rows of " + std::to_string(d.seq_len) + " tokens") +
               ", fewer than one evaluation reads (" + std::to_string(rows) + " = eval.batches " +
               std::to_string(config.eval.batches) + " x batch " + std::to_string(d.batch_size) + " x " +
               std::to_string(world.size()) + " ranks): some are counted more than once (--eval-batches all scores "
               "each once)");
    }
  }
  if (validation) {
    log.say("validation data: " + what);
  } else {
    log.say("data: " + what + "; " + std::to_string(per_step) + " tokens per step, " +
            std::to_string(per_step * config.runtime.steps) + " in " + std::to_string(config.runtime.steps) + " steps");
  }
  return loader;
}

std::shared_ptr<dist::DeviceMesh> build_mesh(const TrainConfig::Fsdp& f, const std::shared_ptr<dist::World>& world) {
  return std::make_shared<dist::DeviceMesh>(make_mesh(world, f.sharding, static_cast<int>(f.fsdp_size)));
}

void apply_fsdp(models::CausalLMImpl& model, const TrainConfig& config, const std::shared_ptr<dist::DeviceMesh>& mesh,
                const std::shared_ptr<models::HfWeights>& init_weights, RunLog& log) {
  const auto& f = config.fsdp;
  models::ParallelizeOptions par;
  par.activation_checkpoint = config.model.activation_checkpoint;
  par.explicit_prefetch = f.explicit_prefetch;
  par.fsdp.mesh = mesh;
  par.fsdp.strategy = f.sharding;
  par.fsdp.prefetch_depth = static_cast<int>(f.prefetch_depth);
  if (f.cpu_offload) par.fsdp.offload = OffloadPolicy::cpu();
  config.validate_for_shard_group(mesh->layout().shard);
  if (f.reshard_after_forward > 0) par.fsdp.reshard_after_forward = static_cast<int>(f.reshard_after_forward);
  if (f.shard_placement != train::ShardPlacement::kFlat) {
    const bool columns = f.shard_placement == train::ShardPlacement::kColumns;
    par.fsdp.shard_placement = [columns](const std::string&, const at::Tensor& p) -> std::optional<Shard> {
      if (p.dim() == 0) return std::nullopt;
      return Shard{columns && p.dim() >= 2 ? 1 : 0};
    };
  }
  if (init_weights) {
    par.fsdp.param_init = [init_weights](const std::string& fqn, at::Tensor& full) { init_weights->fill(fqn, full); };
  }
  const auto dtype = precision_dtype(config.runtime.precision);
  if (dtype != torch::kFloat) {
    par.fsdp.mixed_precision.param_dtype = dtype;
    par.fsdp.mixed_precision.reduce_dtype = torch::kFloat;
  }
  par.wrap = models::parse_wrap_policy(f.wrap_policy, "--wrap-policy");
  const auto units = models::parallelize(model, par);
  if (!config.model.print) return;
  log.say("FSDP units (--wrap-policy " + f.wrap_policy + "): " + std::to_string(units.size()));
  for (const auto& [name, count] : units) {
    log.say("  " + (name.empty() ? std::string("(root)") : name) + "  " + std::to_string(count) + " parameters");
  }
}

DecayGroups choose_decay_groups(const torch::nn::Module& model) {
  DecayGroups groups;
  for (const auto& p : unique_parameters(model)) {
    if (p.requires_grad()) (p.dim() >= 2 ? groups.decay : groups.no_decay).push_back(p);  // LoRA freezes the rest
  }
  return groups;
}

std::unique_ptr<optim::FusedAdamW> build_optimizer(const TrainConfig::Optim& o, const DecayGroups& groups) {
  auto options = [&](double wd) {
    auto opt = std::make_unique<torch::optim::AdamWOptions>(o.lr);
    opt->betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(wd);
    return opt;
  };
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  param_groups.emplace_back(groups.decay, options(o.weight_decay));
  param_groups.emplace_back(groups.no_decay, options(0.0));
  return std::make_unique<optim::FusedAdamW>(std::move(param_groups), torch::optim::AdamWOptions(o.lr));
}

// [Note: a LoRA checkpoint holds the adapters]
// A LoRA run's checkpoints hold the adapters and their optimizer state
// (checkpoint::Parts::leave_out_frozen), not the frozen base: a run of 66
// steps with --keep-best kept 30 copies of the base before. What the base
// was goes with them: its path and each weight file's size and CRC-32 (the
// preset and seed for a preset), so that a resume on other weights, and
// `fsdp ckpt export` of the adapters, are refused by name. The files are
// read once at the start for it (about 1 s a GB).
nlohmann::json lora_base_identity(const TrainConfig& config) {
  namespace fs = std::filesystem;
  const std::string& dir = config.model.init_from;
  if (dir.empty()) {
    return {{"preset", config.model.name}, {"weights", {{"preset", config.model.name}, {"seed", config.runtime.seed},
                                                        {"vocab_size", config.model.vocab_size}}}};
  }
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.size() > 12 && name.substr(name.size() - 12) == ".safetensors") names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  nlohmann::json weights = nlohmann::json::array();
  for (const auto& name : names) {
    const std::string path = dir + "/" + name;
    weights.push_back({{"file", name}, {"bytes", static_cast<int64_t>(fs::file_size(path))}, {"crc32", io::file_crc32(path)}});
  }
  return {{"path", fs::absolute(dir).lexically_normal().string()}, {"weights", weights}};
}

}  // namespace fsdp::train
