// The trainer's start: the run folder, the job's agreement across ranks,
// the tokenizer, the model and its wrapping, a resume, the run's files.
// The loop is trainer.cpp's.

#include "fsdp/train/trainer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fsdp/common/error.h"
#include "fsdp/common/fault_point.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/io/atomic_file.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/train/builders.h"
#include "fsdp/train/hf_companions.h"
#include "fsdp/train/job_agreement.h"

namespace fsdp::train {
namespace {

// Whether two paths name one file (either may not exist yet).
bool names_one_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (std::filesystem::equivalent(a, b, ec)) return true;
  return std::filesystem::weakly_canonical(a, ec) == std::filesystem::weakly_canonical(b, ec);
}

// Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX): where it
// does not, LibTorch emulates bf16 matmuls through fp32, many times slower.
bool cpu_computes_bf16() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    for (std::string flag; words >> flag;) {
      if (flag == "avx512_bf16" || flag == "amx_bf16") return true;
    }
    return false;
  }
  return true;  // not Linux's /proc: no claim either way
}

}  // namespace


void Trainer::build_reference_model() {
  // Built as the policy was (from --init-from, sharded over the same mesh),
  // frozen, without recomputation: it never runs backward.
  TrainConfig reference_config = config_;
  reference_config.model.print = false;
  reference_config.model.activation_checkpoint = false;
  RunLog quiet(-1);
  auto built = build_model(reference_config, *world_, quiet);
  for (auto& p : built.model->parameters()) p.requires_grad_(false);
  keep_frozen_in_compute_dtype(*built.model, reference_config);
  apply_fsdp(*built.model, reference_config, mesh_, built.init_weights, quiet);
  built.model->eval();
  reference_ = built.model;
  log_.say("DPO: the reference is the starting model, frozen and sharded as the policy is (" +
           std::to_string(built.parameters) + " parameters more, a shard of them on each rank)");
}

void Trainer::set_up() {
  choose_run_folder();
  // Before the first collective whose shapes depend on the job.
  check_ranks_run_one_job(config_, world_->group(), world_->rank(), world_->size());
  check_output_paths(config_, paths_.folder, log_.speaks());
  if (log_.speaks()) fault_point("train.start_folders_made");
  torch::manual_seed(static_cast<uint64_t>(config_.runtime.seed));  // the same initial weights on every rank
  auto built = build_model(config_, *world_, log_);
  model_ = built.model;
  params_ = built.parameters;
  active_params_ = model_->active_parameter_count();
  train_data_ = build_loader(config_, *model_, *world_, /*validation=*/false, log_);
  if (!config_.data.val.empty()) {
    val_data_ = build_loader(config_, *model_, *world_, /*validation=*/true, log_);
  } else if (config_.eval.every > 0) {
    log_.warn("--eval-every " + std::to_string(config_.eval.every) + " has no effect without --val-data");
  }
  load_tokenizer();
  const DecayGroups groups = choose_decay_groups(*model_);
  mesh_ = build_mesh(config_.fsdp, world_);
  apply_fsdp(*model_, config_, mesh_, built.init_weights, log_);
  if (dpo()) {
    if (config_.lora.rank == 0) {
      build_reference_model();
    } else if (config_.lora.init_from.empty()) {
      log_.say("DPO: the reference is the model with its LoRA adapters off (fresh adapters leave the base unchanged)");
    } else {
      // Taken before a resume loads trained adapters: the run's start.
      torch::NoGradGuard no_grad;
      int64_t held = 0;
      for (const auto& p : model_->parameters()) {
        if (!p.requires_grad()) continue;
        starting_adapters_.emplace_back(p, p.detach().clone());
        held += p.numel();
      }
      log_.say("DPO: the reference is the model with the adapters of " + config_.lora.init_from + " (" +
               std::to_string(held) + " adapter values kept on this rank), as TRL keeps them as a frozen \"ref\" adapter");
    }
  }
  optimizer_ = build_optimizer(config_.optim, groups);
  optimizer_->set_state_offload(config_.fsdp.optimizer_offload);
  if (config_.fsdp.overlap_host_step) host_step_ = std::make_unique<OverlappedHostStep>(*model_, *optimizer_);
  if (precision_dtype(config_.runtime.precision) == torch::kHalf) {
    scaler_ = std::make_unique<ShardedGradScaler>(world_->group());
  }
  resume_if_possible();
  schedule_ = {config_.optim.lr, config_.optim.min_lr_ratio, config_.optim.warmup_steps, config_.runtime.steps,
               config_.optim.lr_schedule};
  log_cadence_ = {config_.logging.every, /*at_first=*/true};
  eval_cadence_ = {config_.eval.every, false};
  guard_ = std::make_unique<StepGuard>(config_.guard.skip_spikes, config_.guard.max_bad_steps, scaler_ != nullptr);
  profile_ = std::make_unique<ProfileWindow>(StepRange::parse(config_.logging.profile_steps, "--profile-steps"),
                                             paths_.folder.trace(world_->rank()), "rank " + std::to_string(world_->rank()));
  warn_about_profile_window();
  const auto& o = config_.optim;
  // The rate reaches --lr at step --warmup-steps: with as many steps, the
  // last one trains at --lr, and only more warm-up steps fall short.
  if (o.warmup_steps > config_.runtime.steps) {
    char rates[64];
    std::snprintf(rates, sizeof(rates), "%.3g, never reaching --lr %.3g", schedule_.at(config_.runtime.steps - 1), o.lr);
    log_.warn("--warmup-steps " + std::to_string(o.warmup_steps) + " is more than --steps " +
              std::to_string(config_.runtime.steps) + ": the learning rate rises for the whole run and ends at " +
              rates + " (fewer warm-up steps, or more steps)");
  }
  if (config_.runtime.precision == Precision::kBf16 && world_->device().is_cpu() && !cpu_computes_bf16()) {
    log_.warn("--precision bf16 on a CPU without bf16 instructions (no avx512_bf16 or amx_bf16 in /proc/cpuinfo): "
              "its matmuls are emulated, 25-40x slower than fp32 (measured on AVX2 machines); --precision fp32 is "
              "the fast choice here");
  }
  if (!checkpointable()) {
    log_.say("note: --shard-placement columns cannot be checkpointed: a stop by Ctrl-C or SIGTERM saves nothing "
             "(--export-hf DIR keeps the trained weights)");
  } else if (!checkpointer_->enabled() && config_.hf_export.dir.empty()) {
    log_.say("note: no checkpoint is written and nothing is exported: the trained weights are not kept "
             "(--save-every N or --ckpt-dir DIR saves them, --export-hf DIR exports them; a stop by Ctrl-C or "
             "SIGTERM saves into the run folder)");
  }
  // Measured before the run's files are written: a stop during it leaves
  // none of them (UndoOnSignal), one after it a step and a checkpoint.
  peak_flops_ = measured_peak_flops(precision_dtype(config_.runtime.precision), world_->device());
  // Everything is validated; only now may files be written.
  open_run_files();
}

Trainer::~Trainer() = default;

void Trainer::choose_run_folder() {
  auto& r = config_.runtime;
  if (!r.out_dir.empty() && !r.run_name.empty()) {
    log_.warn("runtime.run_name '" + r.run_name + "' has no effect: runtime.out_dir is set, and the run folder is " +
              r.out_dir);
  }
  // Every rank names the run after rank 0's clock, or after when its
  // launcher started: a job restarted by `fsdp launch --max-restarts`
  // finds its own folder again, and resumes from it.
  double started = static_cast<double>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  if (const char* launched = std::getenv("FSDP_RUN_STARTED"); launched != nullptr && std::atoll(launched) > 0) {
    started = static_cast<double>(std::atoll(launched));
  }
  auto t = torch::full({1}, world_->rank() == 0 ? started : 0.0, torch::kDouble);
  dist::all_reduce(world_->group(), t, dist::ReduceOp::kMax).wait();
  const auto started_s = static_cast<int64_t>(t.item<double>());
  // Nothing named the folder: <model>-<time> is the trainer's choice, and
  // two jobs started in the same second choose alike.
  const bool default_name = r.out_dir.empty() && r.run_name.empty();
  const TrainConfig as_given = config_;
  paths_ = resolve_run_paths(config_, started_s);
  // Every rank has seen whether the folder was there before any creates it.
  dist::barrier(world_->group());
  // Rank 0 takes the folder's lock; a default folder another job holds
  // gives way to the next free one (-2, -3, ...). The others wait here
  // until rank 0 holds it ([Note: one job owns a run folder]).
  bool made_it = false;
  const int run_suffix = claim_ ? claim_->lock_run_folder(paths_, default_name, made_it) : 0;
  auto suffix = torch::full({1}, static_cast<double>(run_suffix), torch::kDouble);
  dist::all_reduce(world_->group(), suffix, dist::ReduceOp::kMax).wait();
  if (suffix.item<double>() > 1) {
    const std::string taken = paths_.folder.dir;
    config_ = as_given;
    config_.runtime.out_dir = paths_.folder.dir + "-" + std::to_string(static_cast<int>(suffix.item<double>()));
    paths_ = resolve_run_paths(config_, started_s);
    if (log_.speaks() && made_it) {
      paths_.folder_existed = false;
      paths_.run_root_created = std::filesystem::absolute(paths_.folder.dir).lexically_normal().string();
    }
    log_.say("run folder " + taken + " is another job's (started in the same second); this run writes to " +
             paths_.folder.dir);
  }
  if (claim_) {
    // Before check_output_paths and lock_checkpoint_folder create them.
    claim_->remove_created_folders_on_signal(paths_, config_);
    if (paths_.ckpt_dir_derived) refuse_symbolic_link(config_.checkpoint.dir);
    claim_->lock_checkpoint_folder(config_.checkpoint.dir, paths_.folder);
    claim_->refuse_other_jobs_folders(paths_, config_);
  }
  checkpointer_ = std::make_unique<Checkpointer>(config_.checkpoint, *world_, log_);
  // [Note: a LoRA checkpoint holds the adapters]
  if (config_.lora.rank > 0) {
    checkpointer_->leave_out_frozen(true);
    lora_base_ = lora_base_identity(config_);
  }
}

std::string Trainer::tokenizer_dir() const { return companion_sources(config_).tokenizer_dir; }

void Trainer::load_tokenizer() {
  const auto& r = config_.sample;
  if (r.tokens == 0 && config_.eval.samples == 0) return;
  tokenizer_ = data::Tokenizer::from_dir(tokenizer_dir());
  log_.say("samples use the tokenizer " + tokenizer_->source());
  if (r.tokens == 0) return;  // --eval-samples alone: the validation data holds the prompts
  // Checked now, not after training: a prompt the model cannot embed.
  sample_prompt_ = tokenizer_->encode(r.prompt);
  if (sample_prompt_.empty()) sample_prompt_.push_back(tokenizer_->document_separator());
  for (const int32_t id : sample_prompt_) {
    FSDP_CHECK(id < model_->vocab_size(), "--sample-prompt encodes to token ", id,
               ", outside the model's vocabulary of ", model_->vocab_size(), " (tokenizer: ", tokenizer_->source(),
               "; use the model's tokenizer (--tokenizer DIR), another prompt, or another model)");
  }
}

void Trainer::resume_if_possible() {
  const auto state = checkpointer_->resume(*model_, *optimizer_, config_);
  if (!state) return;
  start_step_ = state->step;
  tokens_seen_ = state->tokens_seen;
  resumed_ = true;
  resumed_metrics_ = paths_.folder.metrics();
  if (!state->config_yaml.empty()) {
    try {
      TrainConfig saved;
      saved.load_yaml_text(state->config_yaml, "the checkpoint's configuration");
      if (!saved.logging.metrics.empty()) resumed_metrics_ = saved.logging.metrics;
    } catch (const Error&) {
      resumed_metrics_.clear();  // a configuration from another version: nothing to hold the file to
    }
  }
  const auto& extra = state->extra;
  // A LoRA checkpoint's adapters were trained on one base: the weights
  // --init-from reads now must be those.
  if (config_.lora.rank > 0 && extra.contains("lora_base")) {
    FSDP_CHECK(extra["lora_base"].value("weights", nlohmann::json()) == lora_base_.value("weights", nlohmann::json()),
               "the checkpoint's LoRA adapters were trained on the base ", extra["lora_base"].dump(), ", and this run's ",
               "base is ", lora_base_.dump(), ": its weights differ, so the adapters would be resumed on another ",
               "model. Resume with the base they were trained on (--init-from), or start a new run (another --out-dir)");
  }
  // --keep-best and --patience go on from the run's record.
  if (extra.contains("best_step") && extra["best_step"].is_number_integer() && extra.contains("best_val_loss") &&
      extra["best_val_loss"].is_number() && extra.contains("evals_since_best") &&
      extra["evals_since_best"].is_number_integer()) {
    best_step_ = extra["best_step"].get<int64_t>();
    best_val_ = extra["best_val_loss"].get<double>();
    evals_since_best_ = extra["evals_since_best"].get<int64_t>();
    if (config_.eval.keep_best) checkpointer_->repair_best(best_step_);
  }
  // A run --patience stopped stays stopped, unless its patience was raised.
  const int64_t patience = config_.eval.patience;
  stopped_early_ = extra.value("stopped_early", false) && patience > 0 && evals_since_best_ >= patience;
  // The stream continues after the tokens already trained on, whatever the
  // batch size, accumulation or world size is now.
  train_data_->resume_at(state->step, state->tokens_seen);
  if (scaler_ && state->loss_scale > 0) {
    scaler_ = std::make_unique<ShardedGradScaler>(world_->group(), GradScalerOptions{state->loss_scale});
  }
}

void Trainer::warn_about_profile_window() {
  const StepRange& range = profile_->range();
  const int64_t first = start_step_ + 1, last = config_.runtime.steps;
  if (range.empty()) return;
  const std::string window = "--profile-steps " + config_.logging.profile_steps;
  const std::string steps = " (" + std::to_string(first) + " to " + std::to_string(last) + ")";
  if (range.first > last || range.last < first) {
    log_.warn(window + " lies outside the steps this run trains" + steps + ": no trace will be written");
  } else if (range.first < first || range.last > last) {
    log_.warn(window + " reaches outside the steps this run trains" + steps + ": only the steps inside are traced");
  }
}

void Trainer::open_run_files() {
  if (log_.speaks()) {
    // A metrics file named by --metrics is appended to by the run that
    // resumes; a new run would overwrite what another run wrote there.
    std::error_code ec;
    const auto& metrics = config_.logging.metrics;
    const bool holds_lines = std::filesystem::exists(metrics, ec) &&
                             !(std::filesystem::is_regular_file(metrics, ec) && std::filesystem::file_size(metrics, ec) == 0);
    FSDP_CHECK(resumed_ || paths_.metrics_derived || !holds_lines, "--metrics '", metrics,
               "' exists and this run does not resume the run that wrote it: it would be "
               "overwritten. Remove it, or choose a new path (by default the metrics go to the run folder)");
    // A resume appends only to its own run's file: the one the checkpoint's
    // configuration names (its run folder's when it named none).
    FSDP_CHECK(!resumed_ || !holds_lines || resumed_metrics_.empty() || names_one_file(metrics, resumed_metrics_),
               "--metrics '", metrics, "' holds lines, and the run resumed here wrote its metrics to '",
               resumed_metrics_, "': appending would mix two runs' lines in one file. Give --metrics '",
               resumed_metrics_, "' (or leave it out), or a path that does not exist yet");
    if (!resumed_) {
      const auto aside = set_aside_earlier_run(paths_.folder);
      if (!aside.empty()) log_.say(paths_.folder.dir + " held an earlier run's files; moved them to " + aside);
    }
    refuse_symbolic_links(paths_.folder);
    // Before anything else is written: the file must be this job's alone
    // (another live job appending to it is refused by its lock).
    metrics_ = std::make_unique<MetricsLog>(config_.logging.metrics,
                                            config_.logging.tensorboard ? paths_.folder.tensorboard() : "", resumed_);
    io::AtomicFile yaml(paths_.folder.config());
    const std::string text = recorded_config(config_, paths_).to_yaml();
    yaml.write(text.data(), text.size());
    yaml.commit();
  }
  dist::barrier(world_->group());  // the earlier run's logs are out of the way
  // A resumed run appends to its log: the marker goes before this start's lines.
  log_.open(paths_.folder.log(world_->rank()), start_step_, config_.runtime.steps,
            resumed_ ? "--- resumed at step " + std::to_string(start_step_) + " ---" : "");
  log_.say("run folder: " + paths_.folder.dir);
}

}  // namespace fsdp::train
