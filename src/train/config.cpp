#include "fsdp/train/config.h"

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "fsdp/common/error.h"
#include "fsdp/models/hf/config_reader.h"
#include "fsdp/models/hf/shard_index.h"
#include "fsdp/models/wrap_policy.h"
#include "fsdp/common/suggest.h"

namespace fsdp::train {
namespace {

enum class Kind { kInt, kDouble, kBool, kString, kEnum };

struct Field {
  const char* section;
  const char* key;
  Kind kind;
  const char* flag;  // the `fsdp train` flag that sets it
  const char* help;
  std::function<void*(TrainConfig&)> slot;
  std::vector<std::string> allowed;  // for enumerated strings
  std::string dotted() const { return std::string(section) + "." + key; }
};

// Every configuration key, declared once: the YAML schema, the flags, their
// help text and --print-config all come from this table.
#define FSDP_FIELD(section, key, kind, flag, help, ...) \
  Field { #section, #key, kind, flag, help, [](TrainConfig& c) -> void* { return &c.section.key; }, {__VA_ARGS__} }
// An enum key: its slot is the enum; `allowed` lists the names in the
// enum's order, so a value's index is its enumerator.
#define FSDP_ENUM_FIELD(section, key, flag, help, ...) \
  Field { #section, #key, Kind::kEnum, flag, help, [](TrainConfig& c) -> void* { return &c.section.key; }, {__VA_ARGS__} }

const std::vector<Field>& schema() {
  static const std::vector<Field> fields = {
      FSDP_FIELD(model, name, Kind::kString, "--model", "model preset"),
      FSDP_FIELD(model, init_from, Kind::kString, "--init-from", "start from a Hugging Face directory (config.json + safetensors)"),
      FSDP_FIELD(model, dropout, Kind::kDouble, "--dropout", "dropout probability"),
      FSDP_FIELD(model, activation_checkpoint, Kind::kBool, "--activation-checkpoint", "recompute each block in backward"),
      FSDP_FIELD(model, chunk_loss, Kind::kBool, "--chunk-loss", "cross-entropy without materialising all logits"),
      FSDP_FIELD(model, print, Kind::kBool, "--print-model", "print the module tree, shapes and parameter counts"),
      FSDP_FIELD(data, train, Kind::kString, "--data", "llm.c token files (a file, a glob such as 'train_*.bin', or a comma-separated list), or synthetic"),
      FSDP_FIELD(data, val, Kind::kString, "--val-data", "token files for evaluation (as --data)"),
      FSDP_FIELD(data, seq_len, Kind::kInt, "--seq-len", "tokens per sequence"),
      FSDP_FIELD(data, batch_size, Kind::kInt, "--batch-size", "sequences per rank per micro-step"),
      FSDP_FIELD(data, grad_accum, Kind::kInt, "--grad-accum", "micro-steps per optimizer step"),
      FSDP_FIELD(data, shuffle, Kind::kBool, "--shuffle", "read sequence windows in a seeded permutation (resume and resharding stay exact)"),
      FSDP_FIELD(optim, lr, Kind::kDouble, "--lr", "peak learning rate"),
      FSDP_FIELD(optim, min_lr_ratio, Kind::kDouble, "--min-lr-ratio", "final learning rate as a fraction of --lr (cosine, linear)"),
      FSDP_FIELD(optim, warmup_steps, Kind::kInt, "--warmup-steps", "linear warmup steps"),
      FSDP_ENUM_FIELD(optim, lr_schedule, "--lr-schedule", "learning-rate schedule", "cosine", "linear", "constant"),
      FSDP_FIELD(optim, weight_decay, Kind::kDouble, "--weight-decay", "AdamW weight decay (matrices and embeddings only)"),
      FSDP_FIELD(optim, beta1, Kind::kDouble, "--beta1", "AdamW beta1"),
      FSDP_FIELD(optim, beta2, Kind::kDouble, "--beta2", "AdamW beta2"),
      FSDP_FIELD(optim, eps, Kind::kDouble, "--eps", "AdamW epsilon"),
      FSDP_FIELD(optim, grad_clip, Kind::kDouble, "--grad-clip", "max gradient norm, 0 disables clipping"),
      FSDP_FIELD(runtime, steps, Kind::kInt, "--steps", "optimizer steps"),
      FSDP_FIELD(runtime, seed, Kind::kInt, "--seed", "random seed (weights, synthetic data, shuffling, sampling)"),
      FSDP_ENUM_FIELD(runtime, precision, "--precision", "compute dtype (fp16 needs CUDA)", "fp32", "bf16", "fp16"),
      FSDP_FIELD(runtime, out_dir, Kind::kString, "--out-dir", "run folder: config.yaml, metrics.jsonl, tensorboard/, logs/, checkpoints/ (empty: out/<run name>)"),
      FSDP_FIELD(runtime, run_name, Kind::kString, "--run-name", "names the default run folder (empty: <model>-<date>-<time>)"),
      FSDP_FIELD(runtime, log_every, Kind::kInt, "--log-every", "steps between log lines"),
      FSDP_FIELD(runtime, eval_every, Kind::kInt, "--eval-every", "steps between evaluations (0: only at the end)"),
      FSDP_FIELD(runtime, eval_batches, Kind::kInt, "--eval-batches", "batches per evaluation"),
      FSDP_FIELD(runtime, metrics, Kind::kString, "--metrics", "JSON-lines metrics file (empty: <run folder>/metrics.jsonl)"),
      FSDP_FIELD(runtime, tensorboard, Kind::kBool, "--tensorboard", "write TensorBoard event files to <run folder>/tensorboard"),
      FSDP_FIELD(runtime, profile_steps, Kind::kString, "--profile-steps", "A:B writes a Chrome trace per rank covering steps A..B (1-based)"),
      FSDP_FIELD(runtime, tokenizer, Kind::kString, "--tokenizer", "tokenizer directory for samples: tokenizer.json, or encoder.json + vocab.bpe (default: --init-from's when it has one, else data/gpt2)"),
      FSDP_FIELD(runtime, sample_tokens, Kind::kInt, "--sample-tokens", "tokens to generate at the end"),
      FSDP_FIELD(runtime, sample_prompt, Kind::kString, "--sample-prompt", "prompt for the sample"),
      FSDP_FIELD(runtime, export_hf, Kind::kString, "--export-hf", "write a Hugging Face directory at the end"),
      FSDP_FIELD(runtime, export_dtype, Kind::kString, "--export-dtype", "dtype of exported weights: float32, bfloat16 or float16 (empty: the torch_dtype of the model's config.json)"),
      FSDP_FIELD(runtime, export_shard_size, Kind::kString, "--export-shard-size", "largest exported weight file before sharding with an index (5GB, 500MB, 2GiB)"),
      FSDP_FIELD(runtime, keep_denormals, Kind::kBool, "--keep-denormals", "compute with subnormal floats instead of flushing them to zero (slower on x86)"),
      FSDP_FIELD(runtime, max_bad_steps, Kind::kInt, "--max-bad-steps", "non-finite loss or gradient norm this many steps in a row stops the run (each is skipped)"),
      FSDP_FIELD(runtime, skip_spikes, Kind::kDouble, "--skip-spikes", "skip updates whose loss z-score over recent steps exceeds this (0: off)"),
      FSDP_ENUM_FIELD(fsdp, sharding, "--sharding", "sharding strategy", "full_shard", "shard_grad_op", "no_shard", "hybrid_shard"),
      FSDP_FIELD(fsdp, fsdp_size, Kind::kInt, "--fsdp-size", "shard-group size for hybrid_shard"),
      FSDP_FIELD(fsdp, prefetch_depth, Kind::kInt, "--prefetch-depth", "units gathered ahead"),
      FSDP_FIELD(fsdp, explicit_prefetch, Kind::kBool, "--explicit-prefetch", "each block prefetches its neighbour"),
      FSDP_FIELD(fsdp, wrap_policy, Kind::kString, "--wrap-policy", "FSDP units: block (one per transformer block) or size:N (any attention, MLP or block whose own parameters reach N; --print-model lists them)"),
      FSDP_FIELD(checkpoint, dir, Kind::kString, "--ckpt-dir", "checkpoint directory (empty: <run folder>/checkpoints); a run resumes from its latest"),
      FSDP_FIELD(checkpoint, save_every, Kind::kInt, "--save-every", "steps between checkpoints (0: only at the end and on SIGTERM/SIGINT, when --ckpt-dir is set)"),
      FSDP_FIELD(checkpoint, keep, Kind::kInt, "--keep", "newest checkpoints kept"),
      FSDP_FIELD(checkpoint, resume, Kind::kBool, "--resume", "resume, and fail if there is nothing to resume"),
      FSDP_ENUM_FIELD(checkpoint, on_save_error, "--on-save-error", "when a save fails (a full disk): stop the run, or warn and train on", "stop", "continue"),
  };
  return fields;
}
#undef FSDP_FIELD

const Field& find_field(const std::string& dotted, const std::string& source) {
  for (const auto& f : schema()) {
    if (f.dotted() == dotted) return f;
  }
  throw Error(source + ": unknown key '" + dotted + "'" + did_you_mean(dotted, TrainConfig::keys()) +
              " (valid keys: " + join_words(TrainConfig::keys()) + ")");
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kInt: return "an integer";
    case Kind::kDouble: return "a number";
    case Kind::kBool: return "true or false";
    case Kind::kString: return "a string";
    case Kind::kEnum: return "one of the listed values";
  }
  return "?";
}

void assign(TrainConfig& config, const Field& f, const std::string& value, const std::string& source) {
  const std::string where = source + ": " + f.dotted() + " is '" + value + "': expected ";
  void* slot = f.slot(config);
  switch (f.kind) {
    case Kind::kInt: {
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      FSDP_CHECK(!value.empty() && *end == '\0' && errno == 0, where, kind_name(f.kind));
      *static_cast<int64_t*>(slot) = v;
      break;
    }
    case Kind::kDouble: {
      errno = 0;
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      FSDP_CHECK(!value.empty() && *end == '\0' && errno == 0, where, kind_name(f.kind));
      *static_cast<double*>(slot) = v;
      break;
    }
    case Kind::kBool: {
      if (value == "true" || value == "1" || value == "yes" || value == "on") {
        *static_cast<bool*>(slot) = true;
      } else if (value == "false" || value == "0" || value == "no" || value == "off") {
        *static_cast<bool*>(slot) = false;
      } else {
        throw Error(where + kind_name(f.kind));
      }
      break;
    }
    case Kind::kString: {
      *static_cast<std::string*>(slot) = value;
      break;
    }
    case Kind::kEnum: {
      const auto it = std::find(f.allowed.begin(), f.allowed.end(), value);
      FSDP_CHECK(it != f.allowed.end(), where, "one of ", join_words(f.allowed), did_you_mean(value, f.allowed));
      // Every enum here is an `enum class` over int, declared in `allowed`'s order.
      *static_cast<int*>(slot) = static_cast<int>(it - f.allowed.begin());
      break;
    }
  }
}

std::string value_text(TrainConfig& config, const Field& f) {
  void* slot = f.slot(config);
  switch (f.kind) {
    case Kind::kInt: return std::to_string(*static_cast<int64_t*>(slot));
    case Kind::kDouble: {
      std::ostringstream out;
      out << *static_cast<double*>(slot);
      return out.str();
    }
    case Kind::kBool: return *static_cast<bool*>(slot) ? "true" : "false";
    case Kind::kString: return *static_cast<std::string*>(slot);
    case Kind::kEnum: return f.allowed.at(static_cast<size_t>(*static_cast<int*>(slot)));
  }
  return "";
}

}  // namespace

namespace {
std::string enum_name(const char* dotted, int index) {
  for (const auto& f : schema()) {
    if (f.dotted() == dotted) return f.allowed.at(static_cast<size_t>(index));
  }
  return "?";
}
}  // namespace

std::string name_of(Precision p) { return enum_name("runtime.precision", static_cast<int>(p)); }
std::string name_of(Sharding s) { return enum_name("fsdp.sharding", static_cast<int>(s)); }
std::string name_of(LrScheduleKind k) { return enum_name("optim.lr_schedule", static_cast<int>(k)); }
std::string name_of(OnSaveError e) { return enum_name("checkpoint.on_save_error", static_cast<int>(e)); }

std::vector<std::string> TrainConfig::keys() {
  std::vector<std::string> out;
  for (const auto& f : schema()) out.push_back(f.dotted());
  return out;
}

std::vector<TrainConfig::KeyInfo> TrainConfig::describe() {
  TrainConfig defaults;
  std::vector<KeyInfo> out;
  for (const auto& f : schema()) {
    KeyInfo k;
    k.dotted = f.dotted();
    k.flag = f.flag;
    k.help = f.help;
    k.boolean = f.kind == Kind::kBool;
    k.default_value = value_text(defaults, f);
    switch (f.kind) {
      case Kind::kInt: k.type = "INT"; break;
      case Kind::kDouble: k.type = "FLOAT"; break;
      case Kind::kBool: k.type = "BOOL"; break;
      case Kind::kString: k.type = "TEXT"; break;
      case Kind::kEnum: {
        for (const auto& a : f.allowed) k.type += (k.type.empty() ? "" : "|") + a;
        break;
      }
    }
    out.push_back(std::move(k));
  }
  return out;
}

void TrainConfig::set(const std::string& dotted_key, const std::string& value, const std::string& source) {
  assign(*this, find_field(dotted_key, source), value, source);
}

void TrainConfig::load_yaml(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw Error("--config '" + path + "': cannot read the file");
  } catch (const YAML::Exception& e) {
    throw Error("--config '" + path + "' is not valid YAML: " + e.what());
  }
  load_yaml_node(root, path);
}

void TrainConfig::load_yaml_text(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(source + ": the configuration is not valid YAML: " + e.what());
  }
  load_yaml_node(root, source);
}

namespace {
// A mapping's key as text: a key that is itself a mapping or a list
// (`{ }: 1`) is refused, not left to throw inside yaml-cpp.
std::string key_text(const YAML::Node& key, const std::string& path) {
  FSDP_CHECK(key.IsScalar(), path, ": line ", key.Mark().line + 1, ": a key must be a plain name, not a ",
             key.IsMap() ? "mapping" : key.IsSequence() ? "list" : "null");
  return key.Scalar();
}
}  // namespace

void TrainConfig::load_yaml_node(const YAML::Node& root, const std::string& path) {
  if (root.IsNull()) return;
  FSDP_CHECK(root.IsMap(), path, ": expected sections model, data, optim, runtime, fsdp, checkpoint at the top level");
  std::set<std::string> sections;
  for (const auto& f : schema()) sections.insert(f.section);
  for (const auto& section : root) {
    const auto name = key_text(section.first, path);
    FSDP_CHECK(sections.count(name) != 0, path, ": unknown section '", name, "'",
               did_you_mean(name, {sections.begin(), sections.end()}),
               " (sections: ", join_words({sections.begin(), sections.end()}), ")");
    FSDP_CHECK(section.second.IsMap() || section.second.IsNull(), path, ": section '", name,
               "' must be a mapping of keys to values");
    for (const auto& item : section.second) {
      const std::string dotted = name + "." + key_text(item.first, path);
      const Field& f = find_field(dotted, path);
      FSDP_CHECK(item.second.IsScalar(), path, ": ", dotted, " must be a single value, ", kind_name(f.kind));
      assign(*this, f, item.second.Scalar(), path);
    }
  }
}

void TrainConfig::validate() const {
  const auto positive = [](int64_t v, const char* key) {
    FSDP_CHECK(v >= 1, key, " is ", v, ": expected at least 1");
  };
  positive(data.seq_len, "data.seq_len");
  positive(data.batch_size, "data.batch_size");
  positive(data.grad_accum, "data.grad_accum");
  positive(runtime.steps, "runtime.steps");
  positive(runtime.log_every, "runtime.log_every");
  positive(runtime.eval_batches, "runtime.eval_batches");
  positive(runtime.max_bad_steps, "runtime.max_bad_steps");
  FSDP_CHECK(runtime.eval_every >= 0, "runtime.eval_every is ", runtime.eval_every, ": expected 0 or more");
  FSDP_CHECK(optim.lr > 0, "optim.lr is ", optim.lr, ": expected a positive learning rate");
  FSDP_CHECK(optim.warmup_steps >= 0, "optim.warmup_steps is ", optim.warmup_steps, ": expected 0 or more");
  FSDP_CHECK(optim.min_lr_ratio >= 0 && optim.min_lr_ratio <= 1, "optim.min_lr_ratio is ", optim.min_lr_ratio,
             ": expected 0..1");
  FSDP_CHECK(optim.grad_clip >= 0, "optim.grad_clip is ", optim.grad_clip, ": expected 0 (off) or a positive norm");
  FSDP_CHECK(model.dropout >= 0 && model.dropout < 1, "model.dropout is ", model.dropout, ": expected 0 <= p < 1");
  FSDP_CHECK(fsdp.prefetch_depth >= 0, "fsdp.prefetch_depth is ", fsdp.prefetch_depth, ": expected 0 or more");
  FSDP_CHECK(fsdp.sharding != Sharding::kHybridShard || fsdp.fsdp_size >= 1,
             "fsdp.sharding is hybrid_shard but fsdp.fsdp_size is ", fsdp.fsdp_size,
             ": set the shard-group size (--fsdp-size)");
  FSDP_CHECK(checkpoint.save_every >= 0, "checkpoint.save_every is ", checkpoint.save_every, ": expected 0 or more");
  FSDP_CHECK(checkpoint.keep >= 1, "checkpoint.keep is ", checkpoint.keep, ": expected at least 1");
  // A run folder named by --out-dir or --run-name holds its checkpoints in
  // checkpoints/; without either the folder is a new timestamped one.
  FSDP_CHECK(!checkpoint.resume || !checkpoint.dir.empty() || !runtime.out_dir.empty() || !runtime.run_name.empty(),
             "checkpoint.resume: nothing names where to resume from; give --out-dir (or --run-name) of the run, or "
             "--ckpt-dir");
  FSDP_CHECK(runtime.skip_spikes >= 0, "runtime.skip_spikes is ", runtime.skip_spikes,
             ": expected 0 (off) or a z-score threshold such as 5");
  FSDP_CHECK(!runtime.out_dir.empty() || runtime.run_name.find('/') == std::string::npos, "runtime.run_name '",
             runtime.run_name, "' contains '/': it names one folder under out/ (use --out-dir for a path)");
  FSDP_CHECK(runtime.sample_tokens >= 0, "runtime.sample_tokens is ", runtime.sample_tokens, ": expected 0 or more");
  if (!runtime.export_dtype.empty()) models::hf::parse_export_dtype(runtime.export_dtype, "runtime.export_dtype");
  models::hf::parse_size(runtime.export_shard_size, "runtime.export_shard_size");
  const auto wrap = models::parse_wrap_policy(fsdp.wrap_policy, "fsdp.wrap_policy");
  FSDP_CHECK(wrap.kind == models::WrapPolicy::Kind::kBlock || (!model.activation_checkpoint && !fsdp.explicit_prefetch),
             "fsdp.wrap_policy ", fsdp.wrap_policy,
             " cannot be combined with activation checkpointing or explicit prefetch (both work on whole blocks; use block)");
}

std::vector<std::string> TrainConfig::differences(const TrainConfig& other) const {
  TrainConfig a = *this, b = other;
  std::vector<std::string> out;
  for (const auto& f : schema()) {
    const std::string x = value_text(a, f), y = value_text(b, f);
    if (x != y) out.push_back(f.dotted() + ": " + (x.empty() ? "\"\"" : x) + " -> " + (y.empty() ? "\"\"" : y));
  }
  return out;
}

std::string TrainConfig::to_yaml() const {
  TrainConfig copy = *this;
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string section;
  for (const auto& f : schema()) {
    if (section != f.section) {
      if (!section.empty()) out << YAML::EndMap;
      section = f.section;
      out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    }
    out << YAML::Key << f.key << YAML::Value;
    const std::string text = value_text(copy, f);
    if (f.kind == Kind::kString) {
      out << YAML::DoubleQuoted << text;
    } else {
      out << text;
    }
  }
  out << YAML::EndMap << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace fsdp::train
