// `fsdp train`: configuration from --config, flags and --set, then the trainer.

#include <cstdio>

#include "commands.h"
#include "dist_flags.h"
#include "fsdp/common/error.h"
#include "fsdp/train/config.h"
#include "fsdp/train/trainer.h"

namespace fsdp::cli {
namespace {

struct TrainFlags {
  std::string config_path;
  std::vector<std::pair<std::string, std::string>> overrides;  // (section.key, value) from named flags
  std::vector<std::string> sets;                               // section.key=value
  bool print_config = false;
};

// A flag that sets one configuration key.
void key_option(CLI::App* cmd, TrainFlags& flags, const std::string& name, const std::string& key,
                const std::string& help) {
  cmd->add_option_function<std::string>(
      name, [&flags, key](const std::string& v) { flags.overrides.emplace_back(key, v); }, help + " (" + key + ")");
}

void key_flag(CLI::App* cmd, TrainFlags& flags, const std::string& name, const std::string& key,
              const std::string& help) {
  cmd->add_flag_callback(name, [&flags, key] { flags.overrides.emplace_back(key, "true"); }, help + " (" + key + ")");
}

train::TrainConfig resolve(const TrainFlags& flags) {
  train::TrainConfig config;
  if (!flags.config_path.empty()) config.load_yaml(flags.config_path);
  for (const auto& [key, value] : flags.overrides) config.set(key, value, "command line");
  for (const auto& s : flags.sets) {
    const auto eq = s.find('=');
    if (eq == std::string::npos) throw Error("--set '" + s + "': expected section.key=value");
    config.set(s.substr(0, eq), s.substr(eq + 1), "--set");
  }
  config.validate();
  return config;
}

}  // namespace

void add_train_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<TrainFlags>();
  auto dist_flags = std::make_shared<DistFlags>();
  auto* cmd = app.add_subcommand("train", "train a GPT-2 or Llama model with FSDP");
  dist_flags->add_to(*cmd);
  cmd->add_option("--config", flags->config_path, "YAML file with sections model, data, optim, runtime, fsdp");
  key_option(cmd, *flags, "--model", "model.name", "preset: gpt2-tiny, gpt2-d6, gpt2, ..., llama-tiny, llama3-8b, example");
  key_option(cmd, *flags, "--init-from", "model.init_from", "start from a Hugging Face directory");
  key_option(cmd, *flags, "--dropout", "model.dropout", "dropout probability");
  key_flag(cmd, *flags, "--activation-checkpoint", "model.activation_checkpoint", "recompute blocks in backward");
  key_flag(cmd, *flags, "--chunk-loss", "model.chunk_loss", "cross-entropy without materialising all logits");
  key_flag(cmd, *flags, "--print-model", "model.print", "print the module tree");
  key_option(cmd, *flags, "--data", "data.train", "llm.c token file, or synthetic");
  key_option(cmd, *flags, "--val-data", "data.val", "token file for evaluation");
  key_option(cmd, *flags, "--seq-len", "data.seq_len", "tokens per sequence");
  key_option(cmd, *flags, "--batch-size", "data.batch_size", "sequences per rank per micro-step");
  key_option(cmd, *flags, "--grad-accum", "data.grad_accum", "micro-steps per optimizer step");
  key_option(cmd, *flags, "--lr", "optim.lr", "peak learning rate");
  key_option(cmd, *flags, "--warmup-steps", "optim.warmup_steps", "linear warmup steps");
  key_option(cmd, *flags, "--lr-schedule", "optim.lr_schedule", "cosine, linear or constant");
  key_option(cmd, *flags, "--weight-decay", "optim.weight_decay", "AdamW weight decay on matrices");
  key_option(cmd, *flags, "--grad-clip", "optim.grad_clip", "max gradient norm, 0 to disable");
  key_option(cmd, *flags, "--steps", "runtime.steps", "optimizer steps");
  key_option(cmd, *flags, "--seed", "runtime.seed", "random seed");
  key_option(cmd, *flags, "--precision", "runtime.precision", "fp32, bf16 or fp16");
  key_option(cmd, *flags, "--max-bad-steps", "runtime.max_bad_steps",
             "non-finite loss or gradient norm this many steps in a row stops the run (each is skipped)");
  key_flag(cmd, *flags, "--keep-denormals", "runtime.keep_denormals",
           "compute with subnormal floats instead of flushing them to zero (slower on x86)");
  key_option(cmd, *flags, "--log-every", "runtime.log_every", "steps between log lines");
  key_option(cmd, *flags, "--eval-every", "runtime.eval_every", "steps between evaluations");
  key_option(cmd, *flags, "--metrics", "runtime.metrics", "JSON-lines metrics file");
  key_option(cmd, *flags, "--sample-tokens", "runtime.sample_tokens", "tokens to generate at the end");
  key_option(cmd, *flags, "--sample-prompt", "runtime.sample_prompt", "prompt for the sample");
  key_option(cmd, *flags, "--export-hf", "runtime.export_hf", "write a Hugging Face directory at the end");
  key_option(cmd, *flags, "--sharding", "fsdp.sharding", "full_shard, shard_grad_op, no_shard or hybrid_shard");
  key_option(cmd, *flags, "--fsdp-size", "fsdp.fsdp_size", "shard-group size for hybrid_shard");
  key_option(cmd, *flags, "--prefetch-depth", "fsdp.prefetch_depth", "units gathered ahead");
  key_flag(cmd, *flags, "--explicit-prefetch", "fsdp.explicit_prefetch", "each block prefetches its neighbour");
  key_option(cmd, *flags, "--ckpt-dir", "checkpoint.dir", "checkpoint directory; resumes from its latest checkpoint");
  key_option(cmd, *flags, "--save-every", "checkpoint.save_every", "steps between checkpoints");
  key_option(cmd, *flags, "--keep", "checkpoint.keep", "checkpoints kept");
  key_flag(cmd, *flags, "--resume", "checkpoint.resume", "resume, and fail if there is nothing to resume");
  cmd->add_option("--set", flags->sets, "section.key=value, any configuration key (repeatable)");
  cmd->add_flag("--print-config", flags->print_config, "print the effective configuration and exit");
  cmd->callback([flags, dist_flags, &exit_code] {
    const train::TrainConfig config = resolve(*flags);
    if (flags->print_config) {
      std::printf("%s", config.to_yaml().c_str());
      exit_code = 0;
      return;
    }
    auto world = dist_flags->init_world();
    train::Trainer trainer(config, world);
    trainer.train();
    exit_code = 0;
  });
}

}  // namespace fsdp::cli
