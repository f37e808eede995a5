#pragma once
// The trainer's configuration: a YAML file laid out in sections (model / lora /
// objective / data / optim / runtime / logging / eval / sample / export /
// guard / fsdp /
// checkpoint), then command-line overrides, each checked against one
// schema. Keys that moved out of `runtime` are still read under their old
// names (`runtime.sample_tokens` is `sample.tokens`), so older YAML files
// and checkpoints load. Unknown keys and bad values are errors naming the key,
// what was expected and the closest valid key. Light header: no LibTorch.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/common/sharding.h"
#include "fsdp/train/lr_schedule.h"

namespace YAML {
class Node;
}

namespace fsdp::train {

// Enumerated keys are parsed into these once, when the configuration is
// read; nothing compares their names elsewhere. Each enum's spellings are
// one table (config.cpp; the sharding strategy's in common/sharding.h),
// checked against the enum at compile time (common/enum_spellings.h).
enum class Precision { kFp32, kBf16, kFp16 };
enum class OnSaveError { kStop, kContinue };
// How each unit's parameters are cut (FullyShardOptions::shard_placement).
enum class ShardPlacement { kFlat, kRows, kColumns };
// Where gradients add up across the micro-steps of an accumulating step:
// unsharded, each unit keeping its whole gradient until the last
// micro-step's reduce-scatter (one reduction a step, a whole model's
// gradients held); sharded, reduce-scattered every micro-step into the
// rank's shard (FSDP2's and torchtitan's default: A reductions a step, a
// shard held).
enum class Accumulate { kUnsharded, kSharded };
// What a run trains for: next-token prediction (lm), or preference pairs
// by Direct Preference Optimization (dpo, Rafailov et al. 2023, as TRL's
// DPOTrainer computes it; train/preference.h).
enum class ObjectiveKind { kLm, kDpo };
// DPO's loss on a pair's margin: TRL's loss_type of the same name.
enum class DpoLoss { kSigmoid, kIpo, kHinge };
// The configuration's spelling of a value ("bf16", "hybrid_shard", "cosine").
std::string name_of(Precision p);
std::string name_of(LrScheduleKind k);
std::string name_of(OnSaveError e);
std::string name_of(ShardPlacement p);
std::string name_of(Accumulate a);
std::string name_of(ObjectiveKind k);
std::string name_of(DpoLoss l);

struct TrainConfig {
  struct Model {
    std::string name = "gpt2-tiny";  // a preset; ignored when init_from is set
    std::string init_from;           // a Hugging Face directory (config.json + model.safetensors)
    int64_t vocab_size = 0;          // embedding rows for a preset; 0: the preset's
    double dropout = 0.0;
    bool activation_checkpoint = false;
    bool chunk_loss = false;
    bool print = false;  // print the module tree at start
  } model;
  // LoRA adapters on the model's Linear layers (nn/lora.h): the rest frozen.
  struct Lora {
    int64_t rank = 0;  // 0: off (every parameter trains)
    double alpha = 16;
    double dropout = 0;
    std::string targets = "all-linear";  // comma-separated layer names, or all-linear
    std::string init_from;               // a PEFT adapter directory to go on training; empty: fresh adapters
  } lora;
  // The training objective (YAML section `objective`).
  struct Objective {
    ObjectiveKind name = ObjectiveKind::kLm;
    double beta = 0.1;             // DPO: the strength of the pull toward the reference model
    DpoLoss loss = DpoLoss::kSigmoid;
    double label_smoothing = 0;    // DPO sigmoid: the share of pairs taken as mislabelled (cDPO)
  } objective;
  struct Data {
    std::string train = "synthetic";  // llm.c token files (a file, a glob, a comma list), or "synthetic"
    std::string val;                  // token files for evaluation (optional)
    int64_t seq_len = 64;
    int64_t batch_size = 4;  // sequences per rank per micro-step
    int64_t grad_accum = 1;
    bool shuffle = false;  // sequence windows in a seeded, stateless permutation
    bool pack = false;     // chat data: consecutive examples share a row, attention kept inside each
    // Train on token files another tokenizer than --init-from's made.
    bool allow_tokenizer_mismatch = false;
  } data;
  struct Optim {
    double lr = 3e-4;
    double min_lr_ratio = 0.1;  // of lr, where cosine and linear schedules end
    int64_t warmup_steps = 10;
    LrScheduleKind lr_schedule = LrScheduleKind::kCosine;
    double weight_decay = 0.1;  // on matrices and embeddings, never norms and biases
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double grad_clip = 1.0;  // 0 disables
  } optim;
  struct Runtime {
    int64_t steps = 100;
    // > 0: passes over the training data, which set `steps` (their rows,
    // rounded up to whole steps) once the data is read; replaces --steps.
    double epochs = 0;
    int64_t seed = 1337;
    Precision precision = Precision::kFp32;
    std::string out_dir;          // the run folder; empty: out/<run_name>
    std::string run_name;         // empty: <model>-<date>-<time>, agreed by all ranks
    bool keep_denormals = false;  // default: flush subnormal floats to zero (FTZ/DAZ)
  } runtime;
  struct Logging {
    int64_t every = 10;         // steps between log lines
    std::string metrics;        // JSON-lines file written by rank 0; empty: <out_dir>/metrics.jsonl
    bool tensorboard = true;    // event files in <out_dir>/tensorboard
    std::string profile_steps;  // "A:B": a Chrome trace per rank over steps A..B
    int64_t memory_snapshot = 0;  // steps recorded into <run folder>/memory/rank<N>.pickle (0: off)
  } logging;
  struct Eval {
    int64_t every = 0;  // 0: only at the end (when data.val is set)
    bool every_epoch = false;  // also when an epoch of the training data ends
    int64_t batches = 8;       // 0 (spelled "all" too): the whole validation set, each row once
    // Save a checkpoint at each evaluation that lowers the validation loss,
    // kept as <checkpoint dir>/best; the run's export and sample then use it.
    bool keep_best = false;
    int64_t patience = 0;  // stop after this many evaluations in a row without a lower loss (0: never)
    int64_t samples = 0;        // greedy completions of the first validation prompts at each evaluation
    int64_t sample_max_tokens = 48;  // the most tokens each of them generates
  } eval;
  struct Sample {
    std::string tokenizer;  // empty: init_from's tokenizer when it has one, else data/gpt2
    int64_t tokens = 0;     // generate this many tokens at the end
    std::string prompt = "\n";
  } sample;
  struct HfExport {
    std::string dir;                 // write a Hugging Face directory at the end
    std::string dtype;               // float32, bfloat16, float16; empty: config.json's torch_dtype
    std::string shard_size = "5GB";  // shard exported weights above this (save_pretrained's default)
    bool merge_lora = false;         // with LoRA: the adapters folded into the weights, not a PEFT adapter
  } hf_export;                       // the YAML section `export`
  struct Guard {
    int64_t max_bad_steps = 3;  // non-finite steps in a row (skipped) before the run stops
    double skip_spikes = 0;     // skip updates whose loss z-score exceeds this; 0: off
  } guard;
  struct Fsdp {
    ShardingStrategy sharding = ShardingStrategy::kFullShard;
    int64_t fsdp_size = 0;  // shard-group size for hybrid_shard
    int64_t prefetch_depth = 1;
    // Ranks a block's parameters stay sharded over between its forward and
    // backward: 0 lets the strategy decide (full_shard frees them over the
    // whole shard group, shard_grad_op keeps them gathered); a divisor k of
    // the shard group's size keeps 1/k per rank, so backward gathers inside
    // groups of k ranks (one node's). The root always keeps its own.
    int64_t reshard_after_forward = 0;
    bool explicit_prefetch = false;
    std::string wrap_policy = "block";  // block, or size:N (models/wrap_policy.h)
    // flat: each unit's parameters end to end, one 1-D slice per rank;
    // rows: every parameter chunked along its first dim (Shard(0), FSDP2's
    // layout), each rank holding whole rows of each; columns: matrices on
    // Shard(1), the rest on Shard(0) (not checkpointable: a rank's columns
    // are not one range of the matrix).
    ShardPlacement shard_placement = ShardPlacement::kFlat;
    Accumulate accumulate = Accumulate::kUnsharded;  // with data.grad_accum > 1
    // FSDP2's CPUOffloadPolicy: sharded parameters, gradients and the
    // optimizer's step on the host (OffloadPolicy::cpu()).
    bool cpu_offload = false;
    // AdamW's moments on the host, parameters and gradients on the compute
    // device (FusedAdamW::set_state_offload). Not with cpu_offload.
    bool optimizer_offload = false;
    // Under cpu_offload: each unit's update starts on the host as soon as
    // its gradients land there, while backward goes on (not with clipping,
    // fp16's scaler or the spike guard, which decide after backward).
    bool overlap_host_step = false;
  } fsdp;
  struct Checkpoint {
    std::string dir;         // where checkpoints go; a run resumes from DIR/latest when there is one
    int64_t save_every = 0;  // steps between saves (0: only at the end and on SIGTERM/SIGINT)
    int64_t keep = 3;        // newest checkpoints kept
    bool resume = false;     // insist on resuming (an error if DIR holds no checkpoint)
    int64_t resume_from = 0;  // resume from DIR/step_N instead of `latest` (0: latest)
    // A save that fails (a full disk): stop the run, or warn and train on
    // (`latest` stays on the last complete checkpoint either way).
    OnSaveError on_save_error = OnSaveError::kStop;
    // Stage each save in host memory and write it in the background while
    // training goes on (checkpoint/async_save.h); the next save and the end
    // of the run wait for it.
    bool async_save = false;
  } checkpoint;

  // Loads a YAML file over the current values. Throws fsdp::Error naming
  // the file, the key and the problem.
  void load_yaml(const std::string& path);
  // The same from text (a checkpoint's saved configuration); `source` names it.
  void load_yaml_text(const std::string& text, const std::string& source);
  // Sets "section.key" from text, as --set does; `source` names where the
  // setting came from in errors.
  void set(const std::string& dotted_key, const std::string& value, const std::string& source);
  // Tokens one optimizer step trains on: ranks x batch size x accumulation
  // x sequence length.
  int64_t tokens_per_step(int64_t world_size) const {
    return world_size * data.batch_size * data.grad_accum * data.seq_len;
  }
  // lora.targets as a list.
  std::vector<std::string> lora_targets() const;
  // Cross-field checks (allowed values, positive sizes, ...).
  void validate() const;
  // Checks that need the shard group's size (the world size, --fsdp-size
  // under hybrid_shard, 1 under no_shard): --reshard-after-forward divides it.
  void validate_for_shard_group(int shard_group) const;
  std::string to_yaml() const;
  // "key: this -> other" for every key whose value differs.
  std::vector<std::string> differences(const TrainConfig& other) const;

  static std::vector<std::string> keys();
  // The sections, in the order config.yaml writes them.
  static std::vector<std::string> sections();

  // One configuration key as the command line presents it.
  struct KeyInfo {
    std::string dotted;  // section.key
    std::string flag;    // --flag
    std::string type;    // INT, FLOAT, BOOL, TEXT, or the allowed values joined by '|'
    std::string help;
    std::string default_value;  // as --print-config writes it, before YAML's quoting
    bool boolean = false;
  };
  static std::vector<KeyInfo> describe();

 private:
  void load_yaml_node(const YAML::Node& root, const std::string& source);
};

}  // namespace fsdp::train
