#include "fsdp/train/trainer.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <cmath>
#include <csignal>
#include <filesystem>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/compat.h"
#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/core/grad_norm.h"
#include "fsdp/core/memory.h"
#include "fsdp/dist/collectives.h"
#include "fsdp/dist/desync.h"
#include "fsdp/dist/flight_recorder.h"
#include "fsdp/models/hf/config_reader.h"
#include "fsdp/models/parallelize.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/lm_loss.h"
#include "fsdp/optim/fused_adamw.h"
#include "fsdp/io/atomic_file.h"
#include "fsdp/train/generate.h"

namespace fsdp::train {
namespace {

// SIGTERM/SIGINT ask for a clean stop: finish the step, save, exit 0.
volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

// Every rank stops at the same step, whichever saw the signal. The same
// all-reduce checks that the ranks issued the same collectives this step
// (see [Note: desync checks]).
bool stop_requested(dist::ProcessGroup& group, int64_t step) {
  return dist::any_rank_and_check_sync(group, g_stop_signal != 0, "at the end of step " + std::to_string(step + 1));
}

// Whether every rank's parameters are finite (a finite step can still
// overflow them, with a huge learning rate): a checkpoint is never written
// from non-finite weights.
bool parameters_finite(dist::ProcessGroup& group, const torch::nn::Module& model) {
  bool finite = true;
  for (const auto& p : unique_parameters(model)) finite = finite && torch::isfinite(p.detach()).all().item<bool>();
  auto t = torch::full({1}, finite ? 0.0f : 1.0f);
  dist::all_reduce(group, t, dist::ReduceOp::kMax).wait();
  return t.item<float>() == 0;
}

torch::ScalarType precision_dtype(Precision p) {
  switch (p) {
    case Precision::kBf16: return torch::kBFloat16;
    case Precision::kFp16: return torch::kHalf;
    case Precision::kFp32: break;
  }
  return torch::kFloat;
}

ShardingStrategy strategy_of(Sharding s) {
  switch (s) {
    case Sharding::kShardGradOp: return ShardingStrategy::kShardGradOp;
    case Sharding::kNoShard: return ShardingStrategy::kNoShard;
    case Sharding::kHybridShard: return ShardingStrategy::kHybridShard;
    case Sharding::kFullShard: break;
  }
  return ShardingStrategy::kFullShard;
}

double mean_over_ranks(dist::ProcessGroup& group, double local) {
  auto t = torch::full({1}, local, torch::kDouble);
  dist::all_reduce(group, t, dist::ReduceOp::kAvg).wait();
  return t.item<double>();
}

}  // namespace

Trainer::Trainer(TrainConfig config, std::shared_ptr<dist::World> world)
    : config_(std::move(config)), world_(std::move(world)) {
  config_.validate();
  FSDP_CHECK(config_.runtime.precision != Precision::kFp16 || torch::cuda::is_available(),
             "--precision fp16: fp16 compute needs CUDA, and this is a CPU run; use bf16 (same memory, fp32's range)");
  // Values below 1.2e-38 (fp32's smallest normal) become zero: AdamW's
  // second moments of rarely-hit embedding rows drift there, and x86 takes
  // microcode assists on every subnormal operand (PyTorch's peer slows ~8x).
  at::globalContext().setFlushDenormal(!config_.runtime.keep_denormals);
  if (config_.model.print) {
    // --print-model prints and exits, as --print-config does: no run
    // folder, no data, no step.
    torch::manual_seed(static_cast<uint64_t>(config_.runtime.seed));
    build_model();
    build_mesh();
    apply_fsdp();
    print_only_ = true;
    return;
  }
  choose_run_folder();
  check_output_paths();
  torch::manual_seed(static_cast<uint64_t>(config_.runtime.seed));  // the same initial weights on every rank
  build_model();
  build_data();
  load_tokenizer();
  choose_decay_groups();
  build_mesh();
  apply_fsdp();
  build_optimizer();
  build_scaler();
  resume_if_possible();
  const auto& r = config_.runtime;
  schedule_ = {config_.optim.lr, config_.optim.min_lr_ratio, config_.optim.warmup_steps, r.steps,
               config_.optim.lr_schedule};
  log_cadence_ = {r.log_every, /*at_first=*/true};
  eval_cadence_ = {r.eval_every, false};
  save_cadence_ = {config_.checkpoint.save_every, false};
  profile_ = std::make_unique<ProfileWindow>(StepRange::parse(r.profile_steps, "--profile-steps"),
                                             folder_.trace(world_->rank()), "rank " + std::to_string(world_->rank()));
  // Everything is validated; only now may files be written.
  open_run_files();
  warn_about_profile_window();
  peak_flops_ = measured_cpu_peak_flops(precision_dtype(config_.runtime.precision));
}

Trainer::~Trainer() = default;

void Trainer::choose_run_folder() {
  auto& r = config_.runtime;
  if (!r.out_dir.empty() && !r.run_name.empty() && world_->rank() == 0) {
    std::printf("warning: runtime.run_name '%s' has no effect: runtime.out_dir is set, and the run folder is %s\n",
                r.run_name.c_str(), r.out_dir.c_str());
  }
  if (r.out_dir.empty()) {
    if (r.run_name.empty()) {
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
      const std::string model = !config_.model.init_from.empty()
                                    ? std::filesystem::path(config_.model.init_from).filename().string()
                                    : config_.model.name;
      r.run_name = default_run_name(model, static_cast<int64_t>(t.item<double>()));
    }
    r.out_dir = "out/" + r.run_name;
  }
  folder_.dir = r.out_dir;
  metrics_derived_ = r.metrics.empty();
  if (metrics_derived_) r.metrics = folder_.metrics();
  // Checkpoints are written when asked for (a directory, or a cadence); a
  // folder that already holds some (a run saved here before) continues them.
  auto& c = config_.checkpoint;
  saving_ = !c.dir.empty() || c.save_every > 0;
  if (c.dir.empty() && (saving_ || std::filesystem::exists(folder_.checkpoints() + "/latest"))) {
    c.dir = folder_.checkpoints();
    saving_ = true;
    ckpt_dir_derived_ = true;
  }
}

void Trainer::check_output_paths() const {
  // A run must not train for hours and then find it cannot write its result.
  const auto& r = config_.runtime;
  check_writable_dir(folder_.dir, "--out-dir");
  if (world_->rank() != 0) return;
  check_writable_file(r.metrics, "--metrics");
  if (!config_.checkpoint.dir.empty()) check_writable_dir(config_.checkpoint.dir, "--ckpt-dir");
  if (!r.export_hf.empty()) {
    check_writable_dir(r.export_hf, "--export-hf");
    for (const char* f : {"config.json", "model.safetensors"}) {
      check_writable_file(r.export_hf + "/" + f, "--export-hf");
    }
  }
}

void Trainer::build_model() {
  const auto& m = config_.model;
  if (m.init_from.empty()) {
    model_ = models::build_preset(m.name, m.dropout);
  } else {
    // Deferred: no rank holds the whole model; fully_shard reads each
    // parameter from the memory-mapped file and keeps its shard.
    model_ = models::build_from_hf_dir(m.init_from, /*deferred=*/true);
    init_weights_ = std::make_shared<models::HfWeights>(m.init_from);
    init_weights_->validate(*model_);
  }
  // The world's device decision; FSDP's buffers follow the parameters.
  if (!world_->device().is_cpu()) model_->to(world_->device());
  params_ = models::count_parameters(*model_);
  active_params_ = model_->active_parameter_count();
  if (world_->rank() == 0) {
    std::printf("model %s: %lld parameters (%s), %lld layers, width %lld, vocabulary %lld\n",
                m.init_from.empty() ? m.name.c_str() : m.init_from.c_str(), static_cast<long long>(params_),
                model_->family().c_str(), static_cast<long long>(model_->n_layers()),
                static_cast<long long>(model_->dim()), static_cast<long long>(model_->vocab_size()));
    if (m.print) {
      std::cout << *model_ << "\n";
      for (const auto& item : model_->named_parameters()) {
        std::cout << "  " << item.key() << "  " << item.value().sizes() << "  " << item.value().numel() << "\n";
      }
      std::cout << "  total  " << params_ << " parameters\n";
    }
  }
}

void Trainer::build_data() {
  const auto& d = config_.data;
  FSDP_CHECK(d.seq_len <= model_->max_seq_len(), "data.seq_len ", d.seq_len, " exceeds the model's ",
             model_->max_seq_len(), " positions");
  data::LoaderOptions o;
  o.batch_size = d.batch_size;
  o.seq_len = d.seq_len;
  o.rank = world_->rank();
  o.world = world_->size();
  o.device = world_->device();
  o.grad_accum = static_cast<int>(d.grad_accum);
  o.vocab_size = model_->vocab_size();
  o.seed = static_cast<uint64_t>(config_.runtime.seed);
  o.shuffle = d.shuffle;
  train_data_ = std::make_unique<data::DataLoader>(d.train, o);
  if (!d.val.empty()) {
    o.grad_accum = 1;
    o.seed += 7919;
    o.shuffle = false;
    o.flag = "--val-data";
    val_data_ = std::make_unique<data::DataLoader>(d.val, o);
  } else if (config_.runtime.eval_every > 0 && world_->rank() == 0) {
    std::printf("warning: --eval-every %lld has no effect without --val-data\n",
                static_cast<long long>(config_.runtime.eval_every));
  }
}

std::string Trainer::tokenizer_dir() const {
  const auto& init_from = config_.model.init_from;
  if (!config_.runtime.tokenizer.empty()) return config_.runtime.tokenizer;
  return !init_from.empty() && data::has_tokenizer(init_from) ? init_from : "data/gpt2";
}

void Trainer::load_tokenizer() {
  const auto& r = config_.runtime;
  if (r.sample_tokens == 0) return;
  tokenizer_ = data::Tokenizer::from_dir(tokenizer_dir());
  if (world_->rank() == 0) std::printf("samples use the tokenizer %s\n", tokenizer_->source().c_str());
  // Checked now, not after training: a prompt the model cannot embed.
  sample_prompt_ = tokenizer_->encode(r.sample_prompt);
  if (sample_prompt_.empty()) sample_prompt_.push_back(tokenizer_->document_separator());
  for (const int32_t id : sample_prompt_) {
    FSDP_CHECK(id < model_->vocab_size(), "--sample-prompt encodes to token ", id,
               ", outside the model's vocabulary of ", model_->vocab_size(), " (tokenizer: ", tokenizer_->source(),
               "; use the model's tokenizer (--tokenizer DIR), another prompt, or another model)");
  }
}

void Trainer::choose_decay_groups() {
  // Chosen on the unsharded model: parameters keep their identity through
  // sharding, but not their shape.
  for (const auto& p : unique_parameters(*model_)) (p.dim() >= 2 ? decay_ : no_decay_).push_back(p);
}

void Trainer::build_mesh() {
  const auto& f = config_.fsdp;
  mesh_ = std::make_shared<dist::DeviceMesh>(
      make_mesh(world_, strategy_of(f.sharding), static_cast<int>(f.fsdp_size)));
}

void Trainer::apply_fsdp() {
  const auto& f = config_.fsdp;
  models::ParallelizeOptions par;
  par.activation_checkpoint = config_.model.activation_checkpoint;
  par.explicit_prefetch = f.explicit_prefetch;
  par.fsdp.mesh = mesh_;
  par.fsdp.strategy = strategy_of(f.sharding);
  par.fsdp.prefetch_depth = static_cast<int>(f.prefetch_depth);
  if (init_weights_) {
    par.fsdp.param_init = [weights = init_weights_](const std::string& fqn, at::Tensor& full) { weights->fill(fqn, full); };
  }
  const auto dtype = precision_dtype(config_.runtime.precision);
  if (dtype != torch::kFloat) {
    par.fsdp.mixed_precision.param_dtype = dtype;
    par.fsdp.mixed_precision.reduce_dtype = torch::kFloat;
  }
  par.wrap = models::parse_wrap_policy(f.wrap_policy, "--wrap-policy");
  const auto units = models::parallelize(*model_, par);
  if (config_.model.print && world_->rank() == 0) {
    std::printf("FSDP units (--wrap-policy %s): %zu\n", f.wrap_policy.c_str(), units.size());
    for (const auto& [name, count] : units) {
      std::printf("  %s  %lld parameters\n", name.empty() ? "(root)" : name.c_str(), static_cast<long long>(count));
    }
  }
}

void Trainer::build_optimizer() {
  const auto& o = config_.optim;
  auto options = [&](double wd) {
    auto opt = std::make_unique<torch::optim::AdamWOptions>(o.lr);
    opt->betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(wd);
    return opt;
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay_, options(o.weight_decay));
  groups.emplace_back(no_decay_, options(0.0));
  optimizer_ = std::make_unique<optim::FusedAdamW>(std::move(groups), torch::optim::AdamWOptions(o.lr));
}

void Trainer::warn_about_profile_window() const {
  const StepRange& range = profile_->range();
  const int64_t first = start_step_ + 1, last = config_.runtime.steps;
  if (range.empty() || world_->rank() != 0) return;
  const std::string window = "--profile-steps " + config_.runtime.profile_steps;
  if (range.first > last || range.last < first) {
    progress_->message("warning: " + window + " lies outside the steps this run trains (" + std::to_string(first) + " to " +
                       std::to_string(last) + "): no trace will be written");
  } else if (range.first < first || range.last > last) {
    progress_->message("warning: " + window + " reaches outside the steps this run trains (" + std::to_string(first) +
                       " to " + std::to_string(last) + "): only the steps inside are traced");
  }
}

void Trainer::build_scaler() {
  if (precision_dtype(config_.runtime.precision) == torch::kHalf) {
    scaler_ = std::make_unique<ShardedGradScaler>(world_->group());
  }
}

TrainConfig Trainer::recorded_config() const {
  // config.yaml is reused (--config run1/config.yaml) and copied with its
  // folder: paths that name this folder, or were derived from it, are left
  // out, so a reuse writes where its own flags say and never into this run.
  // Paths the user gave (--metrics, --ckpt-dir, --export-hf) stay.
  TrainConfig recorded = config_;
  recorded.runtime.out_dir.clear();
  recorded.runtime.run_name.clear();
  if (metrics_derived_) recorded.runtime.metrics.clear();
  if (ckpt_dir_derived_) recorded.checkpoint.dir.clear();
  return recorded;
}

void Trainer::open_run_files() {
  const int rank = world_->rank();
  if (rank == 0) {
    if (!resumed_) {
      const auto aside = set_aside_earlier_run(folder_);
      if (!aside.empty()) std::printf("%s held an earlier run's files; moved them to %s\n", folder_.dir.c_str(), aside.c_str());
    }
    io::AtomicFile yaml(folder_.config());
    const std::string text = recorded_config().to_yaml();
    yaml.write(text.data(), text.size());
    yaml.commit();
    metrics_ = std::make_unique<MetricsLog>(config_.runtime.metrics,
                                            config_.runtime.tensorboard ? folder_.tensorboard() : "", resumed_);
  }
  dist::barrier(world_->group());  // the earlier run's logs are out of the way
  progress_ = std::make_unique<Progress>(start_step_, config_.runtime.steps, folder_.log(rank));
  if (resumed_) progress_->log_only("--- resumed at step " + std::to_string(start_step_) + " ---");
  if (rank == 0) std::printf("run folder: %s\n", folder_.dir.c_str());
}

TrainSummary Trainer::train() {
  if (print_only_) return {};
  try {
    return run();
  } catch (const std::exception& e) {
    // The rank's log keeps the reason the run ended, and the collectives
    // it had issued last (the flight recorder).
    progress_->log_only(std::string("error: ") + e.what());
    progress_->log_only("last collectives of this rank (flight recorder):\n" +
                        dist::FlightRecorder::instance().dump(16));
    throw;
  }
}

TrainSummary Trainer::run() {
  if (finished_already_) {
    if (world_->rank() == 0) {
      progress_->message("the checkpoint is at step " + std::to_string(start_step_) + " = runtime.steps: nothing left to train" +
                         " (raise --steps to train further, or use a new --out-dir for a new run)");
    }
    return summary_;
  }
  if (world_->rank() == 0) {
    metrics_->write({{"event", resumed_ ? "resume" : "start"},
                     {"step", start_step_},
                     {"params", params_},
                     {"world_size", world_->size()},
                     {"sharding", name_of(config_.fsdp.sharding)},
                     {"precision", name_of(config_.runtime.precision)},
                     {"threads_per_rank", at::get_num_threads()},
                     {"peak_flops_per_rank", peak_flops_},
                     {"peak_source", "fp32 matmul rate measured at start-up (CPU)"}});
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  if (val_data_ && config_.runtime.eval_every > 0 && start_step_ == 0) evaluate_and_log(0);  // where the curve starts
  for (int64_t step = start_step_; step < config_.runtime.steps; ++step) {
    profile_->step_begins(step);
    const StepStats stats = train_step(step);
    if (profile_->step_ends(step, step + 1 == config_.runtime.steps)) {
      progress_->log_only("profiler trace written: " + profile_->path());
      if (world_->rank() == 0) {
        progress_->message("profiler trace of steps " + config_.runtime.profile_steps + " written: " + profile_->path() +
                           (world_->size() > 1 ? " (one per rank beside it)" : ""));
      }
    }
    after_step(step, stats);
    if (stop_requested_ && step + 1 < config_.runtime.steps) {
      if (world_->rank() == 0) {
        progress_->message("stopped by " + std::string(g_stop_signal == SIGINT ? "SIGINT" : "SIGTERM") + " after step " +
                           std::to_string(step + 1) +
                           (saving_ ? "; resume with the same --out-dir (or --ckpt-dir)" : " (no checkpoints: nothing saved)"));
      }
      return summary_;
    }
  }
  // Every step skipped means no update was applied: not a success.
  const int64_t trained = config_.runtime.steps - start_step_;
  FSDP_CHECK(trained == 0 || skipped_steps_ < trained, "every one of this run's ", trained,
             " steps was skipped (see the step lines above for why): no update was applied, so nothing is saved or "
             "exported");
  finish_run();
  return summary_;
}

void Trainer::after_step(int64_t step, const StepStats& stats) {
  const int64_t total = config_.runtime.steps;
  summary_.train_losses.push_back(stats.loss);
  const bool non_finite = stats.skipped && stats.skip_reason == "not finite";
  if (stats.skipped) ++skipped_steps_;
  bad_steps_in_a_row_ = non_finite ? bad_steps_in_a_row_ + 1 : 0;
  if (!stats.skipped) spikes_.accept(stats.loss);

  if (log_cadence_.due(step, total)) log_step(step, stats);
  if (val_data_ && eval_cadence_.due(step, total)) evaluate_and_log(step + 1);
  if (stats.skipped) {
    const std::string what = "step " + std::to_string(step + 1) + ": loss " + std::to_string(stats.loss) +
                             ", gradient norm " + std::to_string(stats.grad_norm);
    FSDP_CHECK(!non_finite || bad_steps_in_a_row_ < config_.runtime.max_bad_steps, what, ": ", bad_steps_in_a_row_,
               " non-finite steps in a row (--max-bad-steps ", config_.runtime.max_bad_steps,
               "); stopping. Each was skipped, so the weights are those of the last finite step",
               saving_ ? " (the latest checkpoint holds them or earlier ones)" : "",
               ". Lower the learning rate, clip gradients (--grad-clip), or use bf16 instead of fp16");
    if (world_->rank() == 0) progress_->message(what + ": " + stats.skip_reason + ", optimizer step skipped");
  }
  // A skipped step left the state as the last good step did: it is not
  // saved, so `latest` always names a step that trained.
  stop_requested_ = stop_requested(world_->group(), step);
  if (saving_ && !stats.skipped && (save_cadence_.due(step, total) || stop_requested_)) save_checkpoint(step + 1);
}

void Trainer::evaluate_and_log(int64_t steps_done) {
  const double val = evaluate();
  summary_.val_losses.push_back(val);
  if (world_->rank() != 0) return;
  metrics_->write({{"split", "val"}, {"step", steps_done}, {"loss", val}});
  char line[128];
  std::snprintf(line, sizeof(line), "step %lld: val loss %.4f", static_cast<long long>(steps_done), val);
  progress_->message(line);
}

void Trainer::finish_run() {
  if (world_->rank() == 0) progress_->finish();
  if (world_->rank() == 0 && failed_saves_ > 0) {
    progress_->message("warning: " + std::to_string(failed_saves_) +
                       " checkpoint save(s) failed in this run (--on-save-error continue); see the warnings above");
  }
  // The trained state is on disk before anything that could still fail.
  try {
    if (config_.runtime.sample_tokens > 0) summary_.sample = sample_text();
    if (!config_.runtime.export_hf.empty()) export_hf();
  } catch (const std::exception& e) {
    if (last_saved_step_ != config_.runtime.steps) {
      config_.checkpoint.dir = folder_.checkpoints();
      save_checkpoint(config_.runtime.steps);
      throw Error(std::string(e.what()) + " (the trained weights were saved to " + folder_.checkpoints() +
                  "; `fsdp ckpt export` writes them in Hugging Face's format)");
    }
    throw;
  }
}

void Trainer::resume_if_possible() {
  const auto& c = config_.checkpoint;
  if (c.dir.empty()) {
    FSDP_CHECK(!c.resume, "--resume: no checkpoint directory (--ckpt-dir, or checkpoints/ in --out-dir)");
    return;
  }
  const auto found = checkpoint::latest(c.dir);
  FSDP_CHECK(found || !c.resume, "--resume: '", c.dir, "' holds no checkpoint (no 'latest')");
  if (!found) return;
  const auto start = std::chrono::steady_clock::now();
  const auto state = checkpoint::load(*found, *model_, *optimizer_, *world_);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  FSDP_CHECK(state.step <= config_.runtime.steps, "checkpoint '", *found, "' is at step ", state.step,
             ", beyond runtime.steps = ", config_.runtime.steps);
  start_step_ = state.step;
  tokens_seen_ = state.tokens_seen;
  resumed_ = true;
  finished_already_ = state.step == config_.runtime.steps;
  last_saved_step_ = state.step;
  // The stream continues after the tokens already trained on, whatever the
  // batch size, accumulation or world size is now.
  train_data_->resume_at(state.step, state.tokens_seen);
  if (scaler_ && state.loss_scale > 0) scaler_ = std::make_unique<ShardedGradScaler>(world_->group(), GradScalerOptions{state.loss_scale});
  if (world_->rank() != 0) return;
  std::printf("resumed from %s at step %lld (saved by %s rank(s) under %s; loaded in %.2f s)\n", found->c_str(),
              static_cast<long long>(state.step), std::to_string(state.mesh.empty() ? 0 : state.mesh[0] * state.mesh[1]).c_str(),
              state.sharding.c_str(), seconds);
  if (!state.config_yaml.empty()) {
    TrainConfig saved;
    try {
      saved.load_yaml_text(state.config_yaml, *found + "/metadata.json");
    } catch (const Error&) {
      return;  // a configuration from another version: nothing to compare
    }
    std::vector<std::string> changed;
    for (const auto& d : saved.differences(config_)) {
      // Where this run writes and how long it runs are expected to change.
      if (d.rfind("runtime.steps:", 0) == 0 || d.rfind("runtime.out_dir:", 0) == 0 ||
          d.rfind("runtime.run_name:", 0) == 0 || d.rfind("runtime.metrics:", 0) == 0 ||
          d.rfind("checkpoint.", 0) == 0) {
        continue;
      }
      changed.push_back(d);
    }
    if (!changed.empty()) {
      std::printf("note: this run's configuration differs from the checkpoint's:\n");
      for (const auto& d : changed) std::printf("  %s\n", d.c_str());
    }
    // The world size is no configuration key, but the global batch follows
    // it: say when it changes (the learning rate was tuned for the old one).
    const int64_t saved_world = state.mesh.size() == 2 ? state.mesh[0] * state.mesh[1] : 0;
    const auto global = [](int64_t world, const TrainConfig& c) {
      return world * c.data.batch_size * c.data.grad_accum * c.data.seq_len;
    };
    if (saved_world > 0 && global(saved_world, saved) != global(world_->size(), config_)) {
      std::printf("note: the global batch changes from %lld tokens per step (%lld ranks x %lld x %lld x %lld) to %lld "
                  "(%d ranks x %lld x %lld x %lld: ranks x batch size x accumulation x sequence length)\n",
                  static_cast<long long>(global(saved_world, saved)), static_cast<long long>(saved_world),
                  static_cast<long long>(saved.data.batch_size), static_cast<long long>(saved.data.grad_accum),
                  static_cast<long long>(saved.data.seq_len), static_cast<long long>(global(world_->size(), config_)),
                  world_->size(), static_cast<long long>(config_.data.batch_size),
                  static_cast<long long>(config_.data.grad_accum), static_cast<long long>(config_.data.seq_len));
    }
  }
}

void Trainer::save_checkpoint(int64_t steps_done) {
  if (!parameters_finite(world_->group(), *model_)) {
    if (world_->rank() == 0) {
      progress_->message("step " + std::to_string(steps_done) +
                         ": weights are not finite; checkpoint not written (the latest stays the last good one)");
    }
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  checkpoint::TrainerState state;
  state.step = steps_done;
  state.tokens_seen = tokens_seen_;
  state.loss_scale = scaler_ ? scaler_->get_scale() : 0.0;
  state.config_yaml = config_.to_yaml();
  try {
    state.hf_config = models::hf_config(*model_).dump(2);
  } catch (const Error&) {
    // A model without a Hugging Face equivalent: the checkpoint still resumes.
  }
  state.sharding = name_of(config_.fsdp.sharding);
  state.mesh = {mesh_->layout().replicate, mesh_->layout().shard};
  std::string path;
  try {
    path = checkpoint::save(config_.checkpoint.dir, static_cast<int>(config_.checkpoint.keep), *model_, *optimizer_,
                            state, *world_);
  } catch (const checkpoint::SaveError& e) {
    // Every rank has the same error, so every rank takes the same branch.
    if (config_.checkpoint.on_save_error == OnSaveError::kStop) {
      throw Error(std::string(e.what()) + ". Stopping (--on-save-error stop); free space and run again to resume, " +
                  "or pass --on-save-error continue to train on without this checkpoint");
    }
    ++failed_saves_;
    if (world_->rank() == 0) {
      progress_->message("warning: " + std::string(e.what()) + "; training on (--on-save-error continue)");
      metrics_->write({{"event", "checkpoint_failed"}, {"step", steps_done}, {"error", e.what()}});
    }
    return;
  }
  last_saved_step_ = steps_done;
  if (world_->rank() == 0) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char line[512];
    std::snprintf(line, sizeof(line), "saved %s (%.2f s)", path.c_str(), secs);
    progress_->message(line);
    metrics_->write({{"event", "checkpoint"}, {"step", steps_done}, {"path", path}, {"seconds", secs}});
  }
}

Trainer::StepStats Trainer::train_step(int64_t step) {
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(schedule_.at(step));
  }
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  const auto start = Clock::now();
  const double comm_before = dist::exposed_comm_seconds();
  clear_event_log(*model_);
  const int64_t A = config_.data.grad_accum;
  double loss_sum = 0, aux_sum = 0, data_s = 0, forward_backward_s = 0;
  for (int a = 0; a < A; ++a) {
    // Reduce gradients once per optimizer step, on the last micro-step.
    set_requires_gradient_sync(*model_, a == A - 1);
    auto t = Clock::now();
    const data::Batch batch = train_data_->batch(step, a);
    data_s += seconds_since(t);
    t = Clock::now();
    // Named ranges split a profiled step (--profile-steps) by phase.
    torch::Tensor lm_loss, loss;
    {
      RECORD_USER_SCOPE("train::forward");
      torch::Tensor hidden = fsdp::call(model_, batch.inputs);
      lm_loss = config_.model.chunk_loss ? nn::chunked_lm_loss(hidden, model_->output_weight(), batch.targets)
                                         : nn::lm_loss(hidden, model_->output_weight(), batch.targets);
      // The MoE load-balancing loss trains the routers; "loss" reports the
      // language-model loss alone, comparable across models and with val loss.
      loss = lm_loss;
      if (const torch::Tensor aux = model_->auxiliary_loss(); aux.defined()) {
        loss = loss + aux;
        aux_sum += aux.item<double>() / static_cast<double>(A);
      }
      loss = loss / static_cast<double>(A);
    }
    {
      RECORD_USER_SCOPE("train::backward");
      (scaler_ ? scaler_->scale(loss) : loss).backward();
    }
    loss_sum += lm_loss.item<double>() / static_cast<double>(A);
    forward_backward_s += seconds_since(t);
  }
  const auto optimizer_start = Clock::now();
  RECORD_USER_SCOPE("train::optimizer");
  if (scaler_) scaler_->unscale_(*optimizer_);
  // Clipping's factor is applied by the optimizer as it reads each
  // gradient (one pass fewer over them), or in place before the scaler.
  const double grad_norm = fsdp::grad_norm(*model_);
  const double clip = clip_factor(grad_norm, config_.optim.grad_clip);
  const double loss = mean_over_ranks(world_->group(), loss_sum);
  std::string skip_reason;
  const bool skip = skip_decision(loss, grad_norm, skip_reason);
  if (skip) {
    if (scaler_) scaler_->update();
  } else if (scaler_) {
    scale_gradients(*model_, clip);
    scaler_->step(*optimizer_);
    scaler_->update();
  } else {
    optimizer_->step_scaled(clip);
  }
  compat::zero_grad_to_none(*optimizer_);
  const double optimizer_s = seconds_since(optimizer_start);
  tokens_seen_ += world_->size() * A * config_.data.batch_size * config_.data.seq_len;
  StepStats stats{loss,        grad_norm, seconds_since(start), dist::exposed_comm_seconds() - comm_before,
                  data_s,      forward_backward_s, optimizer_s, skip, skip_reason};
  if (model_->auxiliary_loss().defined()) stats.aux_loss = mean_over_ranks(world_->group(), aux_sum);
  for (const auto& e : event_log(*model_)) {
    if (e.kind == FSDPEvent::Kind::kAllGather || e.kind == FSDPEvent::Kind::kReduceScatter ||
        e.kind == FSDPEvent::Kind::kAllReduce) {
      ++stats.collectives;
      stats.comm_bytes += e.bytes;
    }
  }
  return stats;
}

bool Trainer::skip_decision(double loss, double grad_norm, std::string& reason) {
  // Both are results of collectives, the same on every rank, so every rank
  // takes the same decision. Under fp16 an infinite gradient is the loss
  // scaler's business (it skips the step and lowers the scale).
  if (!std::isfinite(loss) || (!scaler_ && !std::isfinite(grad_norm))) {
    reason = "not finite";
    return true;
  }
  const double threshold = config_.runtime.skip_spikes;
  const double z = spikes_.z_score(loss);
  if (threshold > 0 && z > threshold) {
    char text[96];
    std::snprintf(text, sizeof(text), "loss spike (z-score %.1f > --skip-spikes %g)", z, threshold);
    reason = text;
    return true;
  }
  return false;
}

void Trainer::log_step(int64_t step, const StepStats& s) {
  const double tokens_per_step = static_cast<double>(world_->size() * config_.data.grad_accum *
                                                     config_.data.batch_size * config_.data.seq_len);
  const double tokens_per_s = tokens_per_step / s.seconds;
  const double flops_per_token = training_flops_per_token(active_params_, model_->n_layers(), config_.data.seq_len, model_->dim());
  const double achieved = flops_per_token * tokens_per_s / world_->size();
  if (achieved > peak_flops_) {
    // The probe's matmul shape ran slower than the model's: the rate this
    // step reached is a better peak, so MFU never exceeds 1.
    progress_->log_only("peak FLOP/s raised from " + std::to_string(peak_flops_) + " to " + std::to_string(achieved) +
                        " (step " + std::to_string(step + 1) + " reached it)");
    peak_flops_ = achieved;
  }
  const double mfu = achieved / peak_flops_;
  const auto mem = memory_stats(*model_, optimizer_.get());
  if (world_->rank() != 0) return;
  nlohmann::json line = {{"step", step + 1},
                   {"loss", s.loss},
                   {"lr", schedule_.at(step)},
                   {"grad_norm", s.grad_norm},
                   {"tokens_per_s", tokens_per_s},
                   {"mfu", mfu},
                   {"step_time_s", s.seconds},
                   {"comm_wait_s", s.comm_seconds},
                   {"skipped", s.skipped},
                   {"skipped_steps", skipped_steps_},
                   {"fsdp_collectives", s.collectives},
                   {"fsdp_comm_mb", static_cast<double>(s.comm_bytes) / (1 << 20)},
                   {"data_s", s.data_seconds},
                   {"forward_backward_s", s.forward_backward_seconds},
                   {"optimizer_s", s.optimizer_seconds},
                   {"peak_rss_mb", static_cast<double>(peak_rss_bytes()) / (1 << 20)},
                   {"sharded_state_mb", static_cast<double>(mem.sharded_param_bytes + mem.grad_bytes +
                                                            mem.optimizer_state_bytes) / (1 << 20)},
                   {"peak_gathered_mb", static_cast<double>(mem.peak_gathered_bytes) / (1 << 20)},
                   {"tokens_seen", tokens_seen_}};
  if (s.aux_loss) line["aux_loss"] = *s.aux_loss;
  metrics_->write(line);
  progress_->log(step, s.loss, tokens_per_s, schedule_.at(step), s.grad_norm);
}

double Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  model_->eval();
  double sum = 0;
  for (int64_t e = 0; e < config_.runtime.eval_batches; ++e) {
    const data::Batch batch = val_data_->batch(e, 0);
    // The loss uses the output head: inside the root's call, where it is gathered.
    sum += fsdp::run(model_, [&] {
             torch::Tensor hidden = model_->forward(batch.inputs);
             return config_.model.chunk_loss ? nn::chunked_lm_loss(hidden, model_->output_weight(), batch.targets)
                                             : nn::lm_loss(hidden, model_->output_weight(), batch.targets);
           }).item<double>();
  }
  model_->train();
  return mean_over_ranks(world_->group(), sum / static_cast<double>(config_.runtime.eval_batches));
}

std::string Trainer::sample_text() {
  auto& tokenizer = *tokenizer_;
  const auto& prompt = sample_prompt_;
  SampleOptions options;
  options.max_new_tokens = config_.runtime.sample_tokens;
  options.seed = static_cast<uint64_t>(config_.runtime.seed);
  const auto ids = generate(model_, prompt, options);
  std::string text = tokenizer.decode(ids);
  if (world_->rank() == 0) std::printf("--- sample (%zu tokens) ---\n%s%s\n---\n", ids.size(), config_.runtime.sample_prompt.c_str(), text.c_str());
  return text;
}

void Trainer::export_hf() {
  const auto params = full_parameters(*model_);
  if (world_->rank() == 0) {
    models::HfExportOptions options;
    const auto& r = config_.runtime;
    if (!r.export_dtype.empty()) options.dtype = models::hf::parse_export_dtype(r.export_dtype, "--export-dtype");
    options.max_shard_bytes = models::hf::parse_size(r.export_shard_size, "--export-shard-size");
    models::save_hf_pretrained(*model_, params, r.export_hf, options);
    // With its tokenizer the directory is complete: `fsdp generate --from`
    // and Hugging Face's AutoTokenizer find it there.
    // A tokenizer with more tokens than the model has rows would make an
    // inconsistent directory (ids the embedding cannot look up): left out.
    namespace fs = std::filesystem;
    const fs::path tokenizer = tokenizer_dir();
    const bool has_json = fs::is_regular_file(tokenizer / "tokenizer.json");
    std::unique_ptr<data::Tokenizer> loaded;
    if (!tokenizer_ && has_json) loaded = data::Tokenizer::from_dir(tokenizer.string());
    const data::Tokenizer* tok = tokenizer_ ? tokenizer_.get() : loaded.get();
    if (has_json && tok != nullptr && tok->vocab_size() > model_->vocab_size()) {
      std::printf("warning: the tokenizer %s was not copied to %s: its %d tokens do not fit the model's vocabulary of "
                  "%lld; give `fsdp generate --from` a matching --tokenizer\n",
                  tok->source().c_str(), r.export_hf.c_str(), tok->vocab_size(),
                  static_cast<long long>(model_->vocab_size()));
    } else {
      for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
        if (fs::is_regular_file(tokenizer / file) && !fs::equivalent(tokenizer, r.export_hf)) {
          fs::copy_file(tokenizer / file, fs::path(r.export_hf) / file, fs::copy_options::overwrite_existing);
        }
      }
    }
    std::printf("exported Hugging Face weights to %s\n", config_.runtime.export_hf.c_str());
  }
  dist::barrier(world_->group());
}

}  // namespace fsdp::train
