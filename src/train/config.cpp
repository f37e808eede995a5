#include "fsdp/train/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <string_view>
#include <type_traits>

#include <yaml-cpp/yaml.h>

#include "fsdp/common/enum_spellings.h"
#include "fsdp/common/error.h"
#include "fsdp/common/suggest.h"
#include "fsdp/core/shard_layout.h"
#include "fsdp/io/input_file.h"
#include "fsdp/models/hf/config_reader.h"
#include "fsdp/models/hf/shard_index.h"
#include "fsdp/models/wrap_policy.h"

// Each enum the configuration holds has one table of its spellings
// ([Note: enum spellings] in fsdp/common/enum_spellings.h); the sharding
// strategy's is beside its enum.
namespace fsdp {
template <>
struct EnumSpellings<train::Precision> {
  static constexpr Spelling<train::Precision> kTable[] = {
      {train::Precision::kFp32, "fp32"}, {train::Precision::kBf16, "bf16"}, {train::Precision::kFp16, "fp16"}};
};
template <>
struct EnumSpellings<train::LrScheduleKind> {
  static constexpr Spelling<train::LrScheduleKind> kTable[] = {{train::LrScheduleKind::kCosine, "cosine"},
                                                               {train::LrScheduleKind::kLinear, "linear"},
                                                               {train::LrScheduleKind::kConstant, "constant"}};
};
template <>
struct EnumSpellings<train::ShardPlacement> {
  static constexpr Spelling<train::ShardPlacement> kTable[] = {{train::ShardPlacement::kFlat, "flat"},
                                                               {train::ShardPlacement::kRows, "rows"},
                                                               {train::ShardPlacement::kColumns, "columns"}};
};
template <>
struct EnumSpellings<train::Accumulate> {
  static constexpr Spelling<train::Accumulate> kTable[] = {{train::Accumulate::kUnsharded, "unsharded"},
                                                           {train::Accumulate::kSharded, "sharded"}};
};
template <>
struct EnumSpellings<train::ObjectiveKind> {
  static constexpr Spelling<train::ObjectiveKind> kTable[] = {{train::ObjectiveKind::kLm, "lm"},
                                                              {train::ObjectiveKind::kDpo, "dpo"}};
};
template <>
struct EnumSpellings<train::DpoLoss> {
  static constexpr Spelling<train::DpoLoss> kTable[] = {
      {train::DpoLoss::kSigmoid, "sigmoid"}, {train::DpoLoss::kIpo, "ipo"}, {train::DpoLoss::kHinge, "hinge"}};
};
template <>
struct EnumSpellings<train::OnSaveError> {
  static constexpr Spelling<train::OnSaveError> kTable[] = {{train::OnSaveError::kStop, "stop"},
                                                            {train::OnSaveError::kContinue, "continue"}};
};
}  // namespace fsdp

namespace fsdp::train {
namespace {

// A key's kind follows from its field's C++ type; any other type is a
// compile error (the kind used to be written by hand beside a void*, where
// a mismatch compiled and wrote the wrong number of bytes).
enum class Kind { kInt, kNumber, kBool, kString, kEnum };

template <typename T>
constexpr bool kUnsupportedType = false;

template <typename T>
constexpr Kind kind_of() {
  if constexpr (std::is_same_v<T, int64_t>) {
    return Kind::kInt;
  } else if constexpr (std::is_same_v<T, double>) {
    return Kind::kNumber;
  } else if constexpr (std::is_same_v<T, bool>) {
    return Kind::kBool;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return Kind::kString;
  } else if constexpr (std::is_enum_v<T>) {
    return Kind::kEnum;
  } else {
    static_assert(kUnsupportedType<T>, "a configuration field is int64_t, double, bool, std::string or an enum");
    return Kind::kString;
  }
}

// What a value of the kind looks like, for messages ("expected an integer").
std::string expected_text(Kind kind, const std::vector<std::string>& allowed) {
  switch (kind) {
    case Kind::kInt: return "an integer";
    case Kind::kNumber: return "a number";
    case Kind::kBool: return "true or false";
    case Kind::kString: return "a string";
    case Kind::kEnum: return "one of " + join_words(allowed);
  }
  return "?";
}

// Parses `text` into `out`. Returns "" when it is a value of T, otherwise
// what was expected instead.
template <typename T>
std::string parse_value(const std::string& text, T& out) {
  constexpr Kind kind = kind_of<T>();
  if constexpr (kind == Kind::kInt) {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0') return expected_text(kind, {});
    if (errno == ERANGE) return "an integer from -2^63 to 2^63-1";
    out = v;
  } else if constexpr (kind == Kind::kNumber) {
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0') return expected_text(kind, {});
    if (errno == ERANGE || !std::isfinite(v)) return "a finite number within double precision's range (1e-308 to 1e308)";
    out = v;
  } else if constexpr (kind == Kind::kBool) {
    if (text == "true" || text == "1" || text == "yes" || text == "on") {
      out = true;
    } else if (text == "false" || text == "0" || text == "no" || text == "off") {
      out = false;
    } else {
      return expected_text(kind, {});
    }
  } else if constexpr (kind == Kind::kString) {
    out = text;
  } else {
    for (const auto& s : spelling_table<T>()) {
      if (text == s.name) {
        out = s.value;
        return "";
      }
    }
    const auto names = spellings<T>();
    return expected_text(kind, names) + did_you_mean(text, names);
  }
  return "";
}

// A value as --print-config writes it (before YAML's quoting); a number
// reads back to the same double.
template <typename T>
std::string value_text(const T& value) {
  constexpr Kind kind = kind_of<T>();
  if constexpr (kind == Kind::kInt) {
    return std::to_string(value);
  } else if constexpr (kind == Kind::kNumber) {
    // %g (0.0003, 1e-08, 0.95) with the fewest digits that read back exactly.
    char buffer[32];
    for (int digits = 1; digits <= 17; ++digits) {
      std::snprintf(buffer, sizeof(buffer), "%.*g", digits, value);
      if (std::strtod(buffer, nullptr) == value) break;
    }
    return buffer;
  } else if constexpr (kind == Kind::kBool) {
    return value ? "true" : "false";
  } else if constexpr (kind == Kind::kString) {
    return value;
  } else {
    return spelling_of(value);
  }
}

struct Field {
  const char* section;
  const char* key;
  const char* flag;  // the `fsdp train` flag that sets it
  const char* help;
  Kind kind;
  std::vector<std::string> allowed;  // an enum's spellings, in enumerator order
  std::string (*parse)(TrainConfig& config, const std::string& text);  // as parse_value
  std::string (*text)(const TrainConfig& config);                      // as value_text
  std::string dotted() const { return std::string(section) + "." + key; }
};

template <typename MemberPointer>
struct MemberOf;
template <typename Class, typename Value>
struct MemberOf<Value Class::*> {
  using Type = Value;
};

// The key `(config.*Section).*Key`: its kind, parsing and printing follow
// from the field's C++ type.
template <auto Section, auto Key>
Field make_field(const char* section, const char* key, const char* flag, const char* help) {
  using Value = typename MemberOf<decltype(Key)>::Type;
  Field f{section, key, flag, help, kind_of<Value>(), {}, nullptr, nullptr};
  if constexpr (std::is_enum_v<Value>) f.allowed = spellings<Value>();
  f.parse = [](TrainConfig& c, const std::string& text) { return parse_value(text, (c.*Section).*Key); };
  f.text = [](const TrainConfig& c) { return value_text((c.*Section).*Key); };
  return f;
}

// Every configuration key, declared once: the YAML schema, the flags, their
// help text and --print-config all come from this table. The key's type is
// its field's in config.h.
#define FSDP_FIELD(section, key, flag, help) \
  make_field<&TrainConfig::section, &decltype(TrainConfig::section)::key>(#section, #key, flag, help)
// A section whose YAML name is a C++ keyword (`export`).
#define FSDP_FIELD_AS(name, section, key, flag, help) \
  make_field<&TrainConfig::section, &decltype(TrainConfig::section)::key>(#name, #key, flag, help)

// clang-format off
const std::vector<Field>& schema() {
  static const std::vector<Field> fields = {
      FSDP_FIELD(model, name, "--model", "model preset"),
      FSDP_FIELD(model, vocab_size, "--vocab-size", "embedding rows for a preset (0: the preset's); token files need ids below it"),
      FSDP_FIELD(model, init_from, "--init-from", "start from a Hugging Face directory (config.json + safetensors)"),
      FSDP_FIELD(model, dropout, "--dropout", "dropout probability"),
      FSDP_FIELD(model, activation_checkpoint, "--activation-checkpoint", "recompute each block in backward"),
      FSDP_FIELD(model, chunk_loss, "--chunk-loss", "cross-entropy without materialising all logits"),
      FSDP_FIELD(model, print, "--print-model", "print the module tree, shapes and parameter counts"),
      FSDP_FIELD(lora, rank, "--lora-rank", "LoRA: train rank-r adapters on the Linear layers --lora-targets names and freeze every other parameter (0: off, full fine-tuning)"),
      FSDP_FIELD(lora, alpha, "--lora-alpha", "LoRA: the adapters' output is scaled by alpha / rank (PEFT's lora_alpha)"),
      FSDP_FIELD(lora, dropout, "--lora-dropout", "LoRA: dropout on the adapters' input"),
      FSDP_FIELD(lora, targets, "--lora-targets", "LoRA: comma-separated layer names (q_proj,v_proj), or all-linear: every Linear layer but the output head and MoE routers"),
      FSDP_FIELD(lora, init_from, "--lora-init-from", "LoRA: start the adapters from a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) instead of fresh ones"),
      FSDP_FIELD(objective, name, "--objective", "what the run trains for: lm (next-token prediction) or dpo (preference pairs from `fsdp data prepare` of {prompt, chosen, rejected} records, against a frozen reference: the starting model, or with LoRA the model with its adapters off)"),
      FSDP_FIELD(objective, beta, "--dpo-beta", "DPO: beta, how strongly the policy is held near the reference (TRL's beta; for ipo, its tau)"),
      FSDP_FIELD(objective, loss, "--dpo-loss", "DPO: the loss on each pair's margin: sigmoid (DPO), ipo (IPO, on per-token log-ratios) or hinge (SLiC)"),
      FSDP_FIELD(objective, label_smoothing, "--dpo-label-smoothing", "DPO sigmoid: the share of pairs assumed mislabelled, in [0, 0.5) (conservative DPO)"),
      FSDP_FIELD(data, train, "--data", "llm.c token files (a file, a glob such as 'train_*.bin', or a comma-separated list read one after another), a weighted mixture of them (A.bin:0.7,B.bin:0.3: each source's share of the sequences, interleaved), or synthetic"),
      FSDP_FIELD(data, val, "--val-data", "token files for evaluation (as --data)"),
      FSDP_FIELD(data, seq_len, "--seq-len", "tokens per sequence"),
      FSDP_FIELD(data, batch_size, "--batch-size", "sequences per rank per micro-step"),
      FSDP_FIELD(data, grad_accum, "--grad-accum", "micro-steps per optimizer step"),
      FSDP_FIELD(data, pack, "--pack", "chat data: put consecutive examples in one row as long as they fit (positions restart and attention stays inside each example) instead of one example a row, padded"),
      FSDP_FIELD(data, shuffle, "--shuffle", "read sequence windows in a seeded permutation (resume and resharding stay exact)"),
      FSDP_FIELD(data, allow_tokenizer_mismatch, "--allow-tokenizer-mismatch",
                 "train on token files that another tokenizer than --init-from's made (their tokenizer_record.json says which)"),
      FSDP_FIELD(optim, lr, "--lr", "peak learning rate"),
      FSDP_FIELD(optim, min_lr_ratio, "--min-lr-ratio", "final learning rate as a fraction of --lr (cosine, linear)"),
      FSDP_FIELD(optim, warmup_steps, "--warmup-steps", "linear warmup steps"),
      FSDP_FIELD(optim, lr_schedule, "--lr-schedule", "learning-rate schedule"),
      FSDP_FIELD(optim, weight_decay, "--weight-decay", "AdamW weight decay (matrices and embeddings only)"),
      FSDP_FIELD(optim, beta1, "--beta1", "AdamW beta1"),
      FSDP_FIELD(optim, beta2, "--beta2", "AdamW beta2"),
      FSDP_FIELD(optim, eps, "--eps", "AdamW epsilon"),
      FSDP_FIELD(optim, grad_clip, "--grad-clip", "max gradient norm, 0 disables clipping"),
      FSDP_FIELD(runtime, steps, "--steps", "optimizer steps"),
      FSDP_FIELD(runtime, epochs, "--epochs", "passes over the training data, instead of --steps (the steps their rows take, rounded up; 0: --steps decides)"),
      FSDP_FIELD(runtime, seed, "--seed", "random seed (weights, synthetic data, shuffling, sampling)"),
      FSDP_FIELD(runtime, precision, "--precision", "compute dtype (fp16 needs CUDA)"),
      FSDP_FIELD(runtime, out_dir, "--out-dir", "run folder: config.yaml, metrics.jsonl, tensorboard/, logs/, checkpoints/ (empty: out/<run name>)"),
      FSDP_FIELD(runtime, run_name, "--run-name", "names the default run folder (empty: <model>-<date>-<time>)"),
      FSDP_FIELD(runtime, keep_denormals, "--keep-denormals", "compute with subnormal floats instead of flushing them to zero (slower on x86)"),
      FSDP_FIELD(logging, every, "--log-every", "steps between log lines"),
      FSDP_FIELD(logging, metrics, "--metrics", "JSON-lines metrics file (empty: <run folder>/metrics.jsonl)"),
      FSDP_FIELD(logging, tensorboard, "--tensorboard", "write TensorBoard event files to <run folder>/tensorboard"),
      FSDP_FIELD(logging, memory_snapshot, "--memory-snapshot", "record every tensor allocation and free (the CPU's, or on a GPU the CUDA caching allocator's history) over this start's first N steps into <run folder>/memory/rank<N>.pickle, for PyTorch's memory viewer (0: off)"),
      FSDP_FIELD(logging, profile_steps, "--profile-steps", "A:B writes a Chrome trace per rank covering steps A..B (1-based)"),
      FSDP_FIELD(eval, every, "--eval-every", "steps between evaluations (0: only at the end)"),
      FSDP_FIELD(eval, every_epoch, "--eval-every-epoch", "also evaluate when an epoch of the training data ends (each pass over its rows)"),
      FSDP_FIELD(eval, batches, "--eval-batches", "batches per evaluation (all, or 0: the whole validation set, each row once)"),
      FSDP_FIELD(eval, keep_best, "--keep-best", "save a checkpoint at each evaluation that lowers the validation loss and keep it as <checkpoint dir>/best (never pruned); the end of the run exports and samples the best weights"),
      FSDP_FIELD(eval, samples, "--eval-samples", "at each evaluation, complete the first N validation prompts greedily (chat data: each example up to its answer; token files: a row's first 32 tokens) and show them in the log, metrics.jsonl and TensorBoard's Text tab"),
      FSDP_FIELD(eval, sample_max_tokens, "--eval-sample-tokens", "the most tokens each --eval-samples completion generates (it stops at the end of a turn or text)"),
      FSDP_FIELD(eval, patience, "--patience", "stop early after this many evaluations in a row without a lower validation loss (0: never); the run then ends as at its last step (saved, exported)"),
      FSDP_FIELD(sample, tokenizer, "--tokenizer", "tokenizer directory for samples: tokenizer.json, or encoder.json + vocab.bpe (default: --init-from's when it has one, else data/gpt2)"),
      FSDP_FIELD(sample, tokens, "--sample-tokens", "tokens to generate at the end"),
      FSDP_FIELD(sample, prompt, "--sample-prompt", "prompt for the sample"),
      FSDP_FIELD_AS(export, hf_export, dir, "--export-hf", "write a Hugging Face directory at the end"),
      FSDP_FIELD_AS(export, hf_export, dtype, "--export-dtype", "dtype of exported weights: float32, bfloat16 or float16 (empty: the torch_dtype of the model's config.json)"),
      FSDP_FIELD_AS(export, hf_export, shard_size, "--export-shard-size", "largest exported weight file before sharding with an index (5GB, 500MB, 2GiB)"),
      FSDP_FIELD_AS(export, hf_export, merge_lora, "--merge-lora", "with LoRA, export a plain model with the adapters folded into its weights, instead of a PEFT adapter directory"),
      FSDP_FIELD(guard, max_bad_steps, "--max-bad-steps", "non-finite loss or gradient norm this many steps in a row stops the run (each is skipped)"),
      FSDP_FIELD(guard, skip_spikes, "--skip-spikes", "skip updates whose loss z-score over recent steps exceeds this (0: off)"),
      FSDP_FIELD(fsdp, sharding, "--sharding", "sharding strategy"),
      FSDP_FIELD(fsdp, fsdp_size, "--fsdp-size", "shard-group size for hybrid_shard"),
      FSDP_FIELD(fsdp, prefetch_depth, "--prefetch-depth", "units gathered ahead"),
      FSDP_FIELD(fsdp, reshard_after_forward, "--reshard-after-forward", "ranks a block stays sharded over between forward and backward: 0 lets --sharding decide, k (dividing the shard group) keeps 1/k per rank so backward gathers inside groups of k ranks, e.g. one node's"),
      FSDP_FIELD(fsdp, explicit_prefetch, "--explicit-prefetch", "each block prefetches its neighbour"),
      FSDP_FIELD(fsdp, shard_placement, "--shard-placement", "how parameters are cut: flat (each unit's parameters end to end, 1-D slices), rows (each parameter on its first dim, FSDP2's Shard(0): whole rows per rank, a copy after each gather) or columns (matrices on Shard(1); not checkpointable)"),
      FSDP_FIELD(fsdp, accumulate, "--accumulate", "where gradients add up over --grad-accum micro-steps: unsharded (each unit keeps its whole gradient, one reduce-scatter on the last micro-step) or sharded (a reduce-scatter every micro-step into the rank's shard, FSDP2's default: a shard of the memory, --grad-accum times the traffic)"),
      FSDP_FIELD(fsdp, cpu_offload, "--cpu-offload", "keep each unit's sharded parameters, their gradients and the optimizer's state on the host (FSDP2's CPUOffloadPolicy): the shard is copied to the compute device before each all-gather and each reduced gradient copied back; the optimizer steps on the host"),
      FSDP_FIELD(fsdp, optimizer_offload, "--optimizer-offload", "keep AdamW's moments on the host, parameters and gradients on the compute device: each step copies gradients and parameters to the host, updates them there and copies the parameters back"),
      FSDP_FIELD(fsdp, overlap_host_step, "--overlap-host-step", "with --cpu-offload: start each unit's update on the host as soon as its gradients land there, while backward goes on (needs --grad-clip 0; a non-finite gradient then stops the run instead of skipping the step)"),
      FSDP_FIELD(fsdp, wrap_policy, "--wrap-policy", "FSDP units: block (one per transformer block) or size:N (any attention, MLP or block whose own parameters reach N; --print-model lists them)"),
      FSDP_FIELD(checkpoint, dir, "--ckpt-dir", "checkpoint directory (empty: <run folder>/checkpoints); a run resumes from its latest"),
      FSDP_FIELD(checkpoint, save_every, "--save-every", "steps between checkpoints (0: only at the end and on SIGTERM/SIGINT, when --ckpt-dir is set)"),
      FSDP_FIELD(checkpoint, keep, "--keep", "newest checkpoints kept"),
      FSDP_FIELD(checkpoint, resume, "--resume", "resume, and fail if there is nothing to resume"),
      FSDP_FIELD(checkpoint, resume_from, "--resume-from", "resume from the checkpoint of this step instead of the latest (0: the latest)"),
      FSDP_FIELD(checkpoint, on_save_error, "--on-save-error", "when a save fails (a full disk): stop the run, or warn and train on"),
      FSDP_FIELD(checkpoint, async_save, "--async-save", "copy each checkpoint to host memory and write it in the background while training goes on (the next save and the end of the run wait for it; a failure is reported there)"),
  };
  return fields;
}
// clang-format on
#undef FSDP_FIELD
#undef FSDP_FIELD_AS

// The sections in the order the schema lists them.
std::vector<std::string> section_names() {
  std::vector<std::string> out;
  for (const auto& f : schema()) {
    if (out.empty() || out.back() != f.section) out.emplace_back(f.section);
  }
  return out;
}

// Keys that moved out of `runtime` into their own sections, under their
// old names: YAML files and checkpoints written before still load.
const std::pair<const char*, const char*> kMovedKeys[] = {
    {"runtime.log_every", "logging.every"},
    {"runtime.metrics", "logging.metrics"},
    {"runtime.tensorboard", "logging.tensorboard"},
    {"runtime.profile_steps", "logging.profile_steps"},
    {"runtime.eval_every", "eval.every"},
    {"runtime.eval_batches", "eval.batches"},
    {"runtime.tokenizer", "sample.tokenizer"},
    {"runtime.sample_tokens", "sample.tokens"},
    {"runtime.sample_prompt", "sample.prompt"},
    {"runtime.export_hf", "export.dir"},
    {"runtime.export_dtype", "export.dtype"},
    {"runtime.export_shard_size", "export.shard_size"},
    {"runtime.max_bad_steps", "guard.max_bad_steps"},
    {"runtime.skip_spikes", "guard.skip_spikes"},
};

const Field& find_field(const std::string& key, const std::string& source) {
  std::string dotted = key;
  for (const auto& [old_name, new_name] : kMovedKeys) {
    if (dotted == old_name) dotted = new_name;
  }
  for (const auto& f : schema()) {
    if (f.dotted() == dotted) return f;
  }
  // The closest key, else the keys of the section named, else the sections:
  // never all 55 keys on one line.
  const auto keys = TrainConfig::keys();
  std::string hint = did_you_mean(dotted, keys);
  if (hint.empty()) {
    const std::string section = dotted.substr(0, dotted.find('.'));
    std::vector<std::string> in_section;
    for (const auto& k : keys) {
      if (k.rfind(section + ".", 0) == 0) in_section.push_back(k.substr(section.size() + 1));
    }
    hint = in_section.empty() ? " (sections: " + join_words(TrainConfig::sections()) + ")"
                              : " (" + section + " has " + join_words(in_section) + ")";
  }
  throw Error(source + ": unknown key '" + dotted + "'" + hint + "; `fsdp train --help` lists every key");
}

void assign(TrainConfig& config, const Field& f, const std::string& value, const std::string& source) {
  // eval.batches' one word: the whole validation set.
  const std::string expected = f.parse(config, f.dotted() == "eval.batches" && value == "all" ? "0" : value);
  FSDP_CHECK(expected.empty(), source, ": ", f.dotted(), " is '", value, "': expected ", expected);
}

}  // namespace

std::string name_of(Precision p) { return spelling_of(p); }
std::string name_of(LrScheduleKind k) { return spelling_of(k); }
std::string name_of(ObjectiveKind k) { return spelling_of(k); }
std::string name_of(DpoLoss l) { return spelling_of(l); }
std::string name_of(OnSaveError e) { return spelling_of(e); }
std::string name_of(ShardPlacement p) { return spelling_of(p); }
std::string name_of(Accumulate a) { return spelling_of(a); }

std::vector<std::string> TrainConfig::sections() { return section_names(); }

std::vector<std::string> TrainConfig::keys() {
  std::vector<std::string> out;
  for (const auto& f : schema()) out.push_back(f.dotted());
  return out;
}

std::vector<TrainConfig::KeyInfo> TrainConfig::describe() {
  const TrainConfig defaults;
  std::vector<KeyInfo> out;
  for (const auto& f : schema()) {
    KeyInfo k;
    k.dotted = f.dotted();
    k.flag = f.flag;
    k.help = f.help;
    k.boolean = f.kind == Kind::kBool;
    k.default_value = f.text(defaults);
    switch (f.kind) {
      case Kind::kInt: k.type = "INT"; break;
      case Kind::kNumber: k.type = "FLOAT"; break;
      case Kind::kBool: k.type = "BOOL"; break;
      case Kind::kString: k.type = "TEXT"; break;
      case Kind::kEnum: k.type = join_words(f.allowed, "|"); break;
    }
    out.push_back(std::move(k));
  }
  return out;
}

void TrainConfig::set(const std::string& dotted_key, const std::string& value, const std::string& source) {
  assign(*this, find_field(dotted_key, source), value, source);
}

void TrainConfig::load_yaml(const std::string& path) {
  const std::string text = io::read_file(path, "--config file");
  YAML::Node root;
  try {
    root = YAML::Load(text);
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
  const std::vector<std::string> sections = section_names();
  FSDP_CHECK(root.IsMap(), path, ": expected sections ", join_words(sections), " at the top level");
  // YAML leaves a repeated key to the reader, and yaml-cpp keeps both: the
  // second would silently win. Refused, naming both lines.
  std::map<std::string, int> first_line;
  const auto once = [&](const std::string& key, const YAML::Node& at) {
    const int line = at.Mark().line + 1;
    const auto [it, fresh] = first_line.emplace(key, line);
    FSDP_CHECK(fresh, path, ": line ", line, ": '", key, "' is set again (first at line ", it->second,
               "); keep one");
  };
  for (const auto& section : root) {
    const auto name = key_text(section.first, path);
    FSDP_CHECK(std::find(sections.begin(), sections.end(), name) != sections.end(), path, ": unknown section '", name,
               "'", did_you_mean(name, sections), " (sections: ", join_words(sections), ")");
    once(name, section.first);
    FSDP_CHECK(section.second.IsMap() || section.second.IsNull(), path, ": section '", name,
               "' must be a mapping of keys to values");
    for (const auto& item : section.second) {
      const std::string dotted = name + "." + key_text(item.first, path);
      once(dotted, item.first);
      const Field& f = find_field(dotted, path);
      FSDP_CHECK(item.second.IsScalar(), path, ": ", dotted, " must be a single value, ", expected_text(f.kind, f.allowed));
      assign(*this, f, item.second.Scalar(), path);
    }
  }
}

std::vector<std::string> TrainConfig::lora_targets() const {
  std::vector<std::string> out;
  std::string item;
  for (const char c : lora.targets + ",") {
    if (c != ',') {
      if (c != ' ') item += c;
      continue;
    }
    if (!item.empty()) out.push_back(item);
    item.clear();
  }
  FSDP_CHECK(out.size() == 1 || std::find(out.begin(), out.end(), "all-linear") == out.end(), "lora.targets '",
             lora.targets, "': all-linear stands alone (it names every Linear layer)");
  return out;
}

std::vector<std::string> TrainConfig::differences(const TrainConfig& other) const {
  std::vector<std::string> out;
  for (const auto& f : schema()) {
    const std::string x = f.text(*this), y = f.text(other);
    if (x != y) out.push_back(f.dotted() + ": " + (x.empty() ? "\"\"" : x) + " -> " + (y.empty() ? "\"\"" : y));
  }
  return out;
}

std::string TrainConfig::to_yaml() const {
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
    const std::string text = f.text(*this);
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
