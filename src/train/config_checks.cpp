// The checks a whole configuration passes before a run starts: each key's
// range, and the keys that must agree with each other. Parsing and the
// schema are config.cpp's.

#include "fsdp/train/config.h"

#include <algorithm>
#include <cmath>

#include "fsdp/common/error.h"
#include "fsdp/core/shard_layout.h"
#include "fsdp/models/hf/config_reader.h"
#include "fsdp/models/hf/shard_index.h"
#include "fsdp/models/wrap_policy.h"

namespace fsdp::train {

void TrainConfig::validate_for_shard_group(int shard_group) const {
  FSDP_CHECK(reshard_ranks_fit(fsdp.reshard_after_forward, shard_group),  // 0: the strategy decides
             "fsdp.reshard_after_forward is ", fsdp.reshard_after_forward, ": expected a number of ranks dividing the "
             "shard group's ", shard_group, " (the world size under full_shard and shard_grad_op, fsdp.fsdp_size "
             "under hybrid_shard), or 0 to let fsdp.sharding decide");
}

void TrainConfig::validate() const {
  const auto positive = [](int64_t v, const char* key) {
    FSDP_CHECK(v >= 1, key, " is ", v, ": expected at least 1");
  };
  positive(data.seq_len, "data.seq_len");
  positive(data.batch_size, "data.batch_size");
  positive(data.grad_accum, "data.grad_accum");
  // Bounds far past any real run, so that no product of them overflows.
  const auto at_most = [](int64_t v, int64_t limit, const char* key) {
    FSDP_CHECK(v <= limit, key, " is ", v, ": expected at most ", limit);
  };
  at_most(data.grad_accum, int64_t{1} << 20, "data.grad_accum");
  at_most(data.seq_len, int64_t{1} << 24, "data.seq_len");
  at_most(data.batch_size, int64_t{1} << 24, "data.batch_size");
  positive(runtime.steps, "runtime.steps");
  FSDP_CHECK(std::isfinite(runtime.epochs) && runtime.epochs >= 0 && runtime.epochs <= 1e9, "runtime.epochs is ",
             runtime.epochs, ": expected 0 (--steps decides) or a positive number of passes over the data");
  FSDP_CHECK(runtime.epochs == 0 || runtime.steps == Runtime{}.steps, "runtime.steps ", runtime.steps,
             " and runtime.epochs ", runtime.epochs, " both say how long to train; give one (--epochs sets the steps)");
  FSDP_CHECK(runtime.epochs == 0 || data.train != "synthetic", "runtime.epochs needs token files (--data): synthetic "
             "data is endless; give --steps");
  positive(logging.every, "logging.every");
  FSDP_CHECK(eval.batches >= 0, "eval.batches is ", eval.batches,
             ": expected a number of batches, or all (0): the whole validation set");
  FSDP_CHECK(eval.batches != 0 || data.val != "synthetic", "eval.batches all: synthetic validation data is "
             "endless; give a number of batches");
  FSDP_CHECK(!eval.every_epoch || data.train != "synthetic", "eval.every_epoch: synthetic training data has no "
             "epochs; give --eval-every N");
  FSDP_CHECK(!eval.every_epoch || !data.val.empty(), "eval.every_epoch evaluates on --val-data, which is not given");
  positive(guard.max_bad_steps, "guard.max_bad_steps");
  FSDP_CHECK(eval.samples >= 0 && eval.samples <= 64, "eval.samples is ", eval.samples,
             ": expected 0 (none) to 64 validation prompts completed at each evaluation");
  FSDP_CHECK(eval.sample_max_tokens >= 1, "eval.sample_max_tokens is ", eval.sample_max_tokens, ": expected at least 1");
  FSDP_CHECK(eval.samples == 0 || !data.val.empty(), "eval.samples completes validation prompts, and --val-data is not given");
  FSDP_CHECK(eval.samples == 0 || data.val != "synthetic", "eval.samples: synthetic validation data has no text to complete");
  FSDP_CHECK(eval.every >= 0, "eval.every is ", eval.every, ": expected 0 or more");
  FSDP_CHECK(eval.patience >= 0, "eval.patience is ", eval.patience, ": expected 0 (never stop early) or a number "
             "of evaluations");
  for (const auto& [on, key] : {std::pair{eval.keep_best, "eval.keep_best"}, std::pair{eval.patience > 0, "eval.patience"}}) {
    FSDP_CHECK(!on || (!data.val.empty() && (eval.every > 0 || eval.every_epoch)), key, " acts on evaluations "
               "during the run: give --val-data and --eval-every N or --eval-every-epoch (now ",
               data.val.empty() ? "no --val-data" : "--eval-every 0", ")");
  }
  FSDP_CHECK(!eval.keep_best || fsdp.shard_placement != ShardPlacement::kColumns, "eval.keep_best saves checkpoints, "
             "and fsdp.shard_placement columns cannot be checkpointed: use rows or flat");
  if (objective.name == ObjectiveKind::kDpo) {
    FSDP_CHECK(std::isfinite(objective.beta) && objective.beta > 0, "objective.beta is ", objective.beta,
               ": expected a positive number (TRL's default is 0.1)");
    FSDP_CHECK(objective.label_smoothing >= 0 && objective.label_smoothing < 0.5, "objective.label_smoothing is ",
               objective.label_smoothing, ": expected 0 <= label_smoothing < 0.5");
    FSDP_CHECK(objective.label_smoothing == 0 || objective.loss == DpoLoss::kSigmoid, "objective.label_smoothing "
               "applies to the sigmoid loss, and objective.loss is ", name_of(objective.loss));
    FSDP_CHECK(!model.init_from.empty(), "--objective dpo tunes a trained model toward preferred answers and needs "
               "it as --init-from DIR (a Hugging Face directory); a preset starts from random weights");
    FSDP_CHECK(data.train != "synthetic", "--objective dpo trains on preference pairs: --data names the token files "
               "`fsdp data prepare` wrote from {\"prompt\", \"chosen\", \"rejected\"} records");
    FSDP_CHECK(!data.pack, "--objective dpo: a pair's chosen and rejected answers are two rows of a batch; --pack "
               "does not apply");
  }
  FSDP_CHECK(optim.lr > 0, "optim.lr is ", optim.lr, ": expected a positive learning rate");
  FSDP_CHECK(optim.warmup_steps >= 0, "optim.warmup_steps is ", optim.warmup_steps, ": expected 0 or more");
  FSDP_CHECK(optim.min_lr_ratio >= 0 && optim.min_lr_ratio <= 1, "optim.min_lr_ratio is ", optim.min_lr_ratio,
             ": expected 0..1");
  FSDP_CHECK(optim.grad_clip >= 0, "optim.grad_clip is ", optim.grad_clip, ": expected 0 (off) or a positive norm");
  // AdamW's moments are averages: each beta weighs the past in [0, 1).
  FSDP_CHECK(optim.beta1 >= 0 && optim.beta1 < 1, "optim.beta1 is ", optim.beta1, ": expected 0 <= beta1 < 1");
  FSDP_CHECK(optim.beta2 >= 0 && optim.beta2 < 1, "optim.beta2 is ", optim.beta2, ": expected 0 <= beta2 < 1");
  FSDP_CHECK(optim.eps > 0, "optim.eps is ", optim.eps, ": expected a small positive number (AdamW divides by it)");
  FSDP_CHECK(optim.weight_decay >= 0, "optim.weight_decay is ", optim.weight_decay, ": expected 0 or more");
  FSDP_CHECK(model.vocab_size >= 0, "model.vocab_size is ", model.vocab_size, ": expected 0 (the preset's) or more");
  FSDP_CHECK(model.dropout >= 0 && model.dropout < 1, "model.dropout is ", model.dropout, ": expected 0 <= p < 1");
  FSDP_CHECK(!fsdp.cpu_offload || !fsdp.optimizer_offload, "fsdp.cpu_offload and fsdp.optimizer_offload are both "
             "set: --cpu-offload keeps the optimizer's state on the host already, with the parameters and "
             "gradients; --optimizer-offload moves only the state. Choose one");
  FSDP_CHECK(!fsdp.overlap_host_step || fsdp.cpu_offload, "fsdp.overlap_host_step overlaps the optimizer's step on "
             "the host with backward, and fsdp.cpu_offload is off (the step is on the compute device): add --cpu-offload");
  FSDP_CHECK(!fsdp.overlap_host_step || optim.grad_clip == 0, "fsdp.overlap_host_step starts each unit's update before "
             "the gradients' global norm is known, and optim.grad_clip is ", optim.grad_clip,
             ": clipping needs that norm first; set --grad-clip 0, or drop --overlap-host-step");
  FSDP_CHECK(!fsdp.overlap_host_step || (runtime.precision != Precision::kFp16 && guard.skip_spikes == 0),
             "fsdp.overlap_host_step makes each update before the step is judged, and ",
             runtime.precision == Precision::kFp16 ? "fp16's loss scaler" : "guard.skip_spikes",
             " may skip the step after backward: drop one of them");
  FSDP_CHECK(fsdp.prefetch_depth >= 0, "fsdp.prefetch_depth is ", fsdp.prefetch_depth, ": expected 0 or more");
  FSDP_CHECK(fsdp.reshard_after_forward >= 0, "fsdp.reshard_after_forward is ", fsdp.reshard_after_forward,
             ": expected 0 (the strategy decides) or a number of ranks dividing the shard group's size");
  FSDP_CHECK(fsdp.sharding != ShardingStrategy::kHybridShard || fsdp.fsdp_size >= 1,
             "fsdp.sharding is hybrid_shard but fsdp.fsdp_size is ", fsdp.fsdp_size,
             ": set the shard-group size (--fsdp-size)");
  FSDP_CHECK(checkpoint.save_every >= 0, "checkpoint.save_every is ", checkpoint.save_every, ": expected 0 or more");
  FSDP_CHECK(checkpoint.resume_from >= 0, "checkpoint.resume_from is ", checkpoint.resume_from,
             ": expected a step (0: the latest checkpoint)");
  FSDP_CHECK(checkpoint.keep >= 1, "checkpoint.keep is ", checkpoint.keep, ": expected at least 1");
  // A run folder named by --out-dir or --run-name holds its checkpoints in
  // checkpoints/; without either the folder is a new timestamped one.
  FSDP_CHECK(!checkpoint.resume || !checkpoint.dir.empty() || !runtime.out_dir.empty() || !runtime.run_name.empty(),
             "checkpoint.resume: nothing names where to resume from; give --out-dir (or --run-name) of the run, or "
             "--ckpt-dir");
  FSDP_CHECK(guard.skip_spikes >= 0, "guard.skip_spikes is ", guard.skip_spikes,
             ": expected 0 (off) or a z-score threshold such as 5");
  FSDP_CHECK(!runtime.out_dir.empty() || runtime.run_name.find('/') == std::string::npos, "runtime.run_name '",
             runtime.run_name, "' contains '/': it names one folder under out/ (use --out-dir for a path)");
  FSDP_CHECK(!runtime.out_dir.empty() || (runtime.run_name != "." && runtime.run_name != ".."), "runtime.run_name '",
             runtime.run_name, "' names no folder of its own under out/ (use a name, or --out-dir for a path)");
  FSDP_CHECK(logging.memory_snapshot >= 0, "logging.memory_snapshot is ", logging.memory_snapshot,
             ": expected 0 (off) or a number of steps");
  FSDP_CHECK(lora.rank >= 0 && lora.rank <= (int64_t{1} << 16), "lora.rank is ", lora.rank,
             ": expected 0 (off) or an adapter rank such as 8, 16 or 64");
  FSDP_CHECK(std::isfinite(lora.alpha) && lora.alpha > 0, "lora.alpha is ", lora.alpha,
             ": expected a positive scale numerator (the adapters are scaled by alpha / rank)");
  FSDP_CHECK(lora.dropout >= 0 && lora.dropout < 1, "lora.dropout is ", lora.dropout, ": expected 0 <= p < 1");
  FSDP_CHECK(!lora_targets().empty(), "lora.targets is empty: expected layer names such as q_proj,v_proj, or all-linear");
  FSDP_CHECK(lora.rank > 0 || lora.init_from.empty(), "lora.init_from names an adapter, and lora.rank is 0 (no "
             "LoRA): give --lora-rank (the adapter's r) and --lora-alpha");
  FSDP_CHECK(lora.rank > 0 || !hf_export.merge_lora, "export.merge_lora folds LoRA adapters into the weights, and "
             "lora.rank is 0 (no adapters): drop --merge-lora, or give --lora-rank");
  FSDP_CHECK(sample.tokens >= 0, "sample.tokens is ", sample.tokens, ": expected 0 or more");
  if (!hf_export.dtype.empty()) models::hf::parse_export_dtype(hf_export.dtype, "export.dtype");
  models::hf::parse_size(hf_export.shard_size, "export.shard_size");
  FSDP_CHECK(fsdp.shard_placement != ShardPlacement::kColumns || (checkpoint.dir.empty() && checkpoint.save_every == 0 &&
                                                   !checkpoint.resume && checkpoint.resume_from == 0),
             "fsdp.shard_placement columns cannot be checkpointed (a rank's columns of a matrix are not one range "
             "of it, which is what checkpoints store): use rows or flat with --ckpt-dir, --save-every or --resume");
  const auto wrap = models::parse_wrap_policy(fsdp.wrap_policy, "fsdp.wrap_policy");
  FSDP_CHECK(wrap.kind == models::WrapPolicy::Kind::kBlock || (!model.activation_checkpoint && !fsdp.explicit_prefetch),
             "fsdp.wrap_policy ", fsdp.wrap_policy,
             " cannot be combined with activation checkpointing or explicit prefetch (both work on whole blocks; use block)");
}

}  // namespace fsdp::train
