// The trainer's loop: steps, evaluation, logging, saves, the end of a run
// and its export. Its start is trainer_start.cpp.

#include "fsdp/train/trainer.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "fsdp/common/compat.h"
#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/core/grad_norm.h"
#include "fsdp/core/memory.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/distributed/desync.h"
#include "fsdp/distributed/flight_recorder.h"
#include "fsdp/io/atomic_file.h"
#include "fsdp/common/allocation_log.h"
#include "fsdp/common/flat_buffer.h"
#include "fsdp/common/fault_point.h"
#include "fsdp/io/memory_snapshot.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/lm_loss.h"
#include "fsdp/nn/lora.h"
#include "fsdp/nn/packed_rows.h"
#include "fsdp/train/builders.h"
#include "fsdp/train/export.h"
#include "fsdp/train/generate.h"
#include "fsdp/train/hf_companions.h"
#include "fsdp/train/job_agreement.h"

namespace fsdp::train {
namespace {

// Allocations and frees a GPU memory snapshot keeps (the newest): a few
// steps of a large model, at about 1 KB each in the pickle.
constexpr int64_t kDeviceHistoryEntries = 200000;

// SIGTERM/SIGINT ask for a clean stop: finish the step, save, exit 0.
volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

void catch_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

// Every rank stops at the same step, whichever saw the signal. The same
// all-reduce checks that the ranks issued the same collectives this step
// (see [Note: desync checks]).
bool stop_requested(dist::ProcessGroup& group, int64_t step) {
  return dist::any_rank_and_check_sync(group, g_stop_signal != 0, "at the end of step " + std::to_string(step + 1));
}

double mean_over_ranks(dist::ProcessGroup& group, double local) {
  auto t = torch::full({1}, local, torch::kDouble);
  dist::all_reduce(group, t, dist::ReduceOp::kAvg).wait();
  return t.item<double>();
}

}  // namespace

Trainer::Trainer(TrainConfig config, std::shared_ptr<dist::World> world)
    : config_(std::move(config)), world_(std::move(world)), log_(world_->rank()) {
  config_.validate();
  FSDP_CHECK(config_.runtime.precision != Precision::kFp16 || torch::cuda::is_available(),
             "--precision fp16: fp16 compute needs CUDA, and this is a CPU run; use bf16 (same memory, fp32's range)");
  // Values below 1.2e-38 (fp32's smallest normal) become zero: AdamW's
  // second moments of rarely-hit embedding rows drift there, and x86 takes
  // microcode assists on every subnormal operand (PyTorch's peer slows ~8x).
  at::globalContext().setFlushDenormal(!config_.runtime.keep_denormals);
  // Tensor memory is counted from here on (allocated_peak_mb, --memory-snapshot).
  memory::count_cpu_allocations();
  if (config_.model.print) {
    // --print-model prints and exits, as --print-config does: no run
    // folder, no data, no step.
    torch::manual_seed(static_cast<uint64_t>(config_.runtime.seed));
    auto built = build_model(config_, *world_, log_);
    apply_fsdp(*built.model, config_, build_mesh(config_.fsdp, world_), built.init_weights, log_);
    return;
  }
  try {
    // A start stopped by a signal leaves no folder behind either: a launcher
    // stops a job whose other rank failed at start-up with SIGTERM.
    if (log_.speaks()) claim_ = std::make_unique<RunFolderClaim>();
    set_up();
  } catch (...) {
    // Nothing was written into the folders this start made: leave none behind.
    if (claim_) claim_->undo(paths_);
    throw;
  }
  // The run's files are written: the folder is the run's, and a stop from
  // here on (the peak measurement, the first step) ends after a step, saved.
  if (claim_) claim_->keep();
  catch_stop_signals();
  fault_point("train.run_files_written");
}

TrainSummary Trainer::train() {
  if (config_.model.print) return {};  // --print-model: printed, nothing to train
  try {
    return run();
  } catch (const std::exception& e) {
    // The rank's log keeps the reason the run ended, and the collectives
    // it had issued last (the flight recorder).
    log_.note(std::string("error: ") + e.what());
    // What was recorded up to the failure is what explains it (an
    // out-of-memory error, say): written, as far as it got.
    if (memory::recording()) {
      try {
        write_memory_snapshot(-1);
      } catch (const std::exception& write_error) {
        log_.note(std::string("the memory snapshot could not be written: ") + write_error.what());
      }
    }
    log_.note("last collectives of this rank (flight recorder):\n" + dist::FlightRecorder::instance().dump(16));
    throw;
  }
}

TrainSummary Trainer::run() {
  if (resumed_ && (start_step_ == config_.runtime.steps || stopped_early_)) {
    log_.say(stopped_early_ ? "the run stopped early at step " + std::to_string(start_step_) + " (" +
                                  std::to_string(evals_since_best_) + " evaluations without a lower validation loss, "
                                  "--patience " + std::to_string(config_.eval.patience) +
                                  "): nothing left to train (a larger --patience, or 0, trains on)"
                            : "the checkpoint is at step " + std::to_string(start_step_) +
                                  " = runtime.steps: nothing left to train (raise --steps to train further, or use "
                                  "a new --out-dir for a new run)");
    // What the end of a run writes, asked for now: the sample and the export.
    last_step_ = start_step_;
    restore_best();
    if (config_.sample.tokens > 0) summary_.sample = sample_text();
    if (!config_.hf_export.dir.empty()) export_hf();
    return summary_;
  }
  if (metrics_) {
    metrics_->write({{"event", resumed_ ? "resume" : "start"},
                     {"step", start_step_},
                     {"params", params_},
                     {"world_size", world_->size()},
                     {"sharding", to_string(config_.fsdp.sharding)},
                     {"precision", name_of(config_.runtime.precision)},
                     {"threads_per_rank", at::get_num_threads()},
                     {"peak_flops_per_rank", peak_flops_},
                     {"peak_source", world_->device().is_cuda()
                          ? "best of 5 bursts of 4096^2 matmuls in the compute dtype, at start-up (GPU)"
                          : "best of 5 bursts of a 1024^2 matmul in the compute dtype, at start-up (CPU)"}});
  }
  if (val_data_ && config_.eval.every > 0 && start_step_ == 0) evaluate_and_log(0);  // where the curve starts
  const int64_t total = config_.runtime.steps;
  memory::reset_allocated_peak();  // the steps' peak, not initialisation's
  last_step_ = start_step_;
  for (int64_t step = start_step_; step < total; ++step) {
    profile_->step_begins(step);
    if (step == start_step_ && config_.logging.memory_snapshot > 0) {
      memory::start_recording();
      if (world_->device().is_cuda()) start_device_memory_history(world_->device(), kDeviceHistoryEntries);
    }
    const StepStats stats = train_step(step);
    if (memory::recording() && (step + 1 - start_step_ == config_.logging.memory_snapshot || step + 1 == total)) {
      write_memory_snapshot(step);
    }
    if (profile_->step_ends(step, step + 1 == total)) {
      log_.note("profiler trace written: " + profile_->path());
      log_.say("profiler trace of steps " + config_.logging.profile_steps + " written: " + profile_->path() +
               (world_->size() > 1 ? " (one per rank beside it)" : ""));
    }
    after_step(step, stats);
    last_step_ = step + 1;
    if (stopped_early_) break;
    if (stop_requested_ && step + 1 < total) {
      if (memory::recording()) write_memory_snapshot(step);  // the steps recorded so far
      // The export folder this start made stays only with an export in it.
      if (log_.speaks()) remove_if_holds_no_file(paths_.export_root_created);
      checkpointer_->wait_for_save(metrics_.get());
      const bool saved = checkpointer_->last_saved_step() == step + 1;
      // Another rank may have seen the signal; the launcher forwards the same one to all.
      summary_.stopped_by_signal = g_stop_signal != 0 ? static_cast<int>(g_stop_signal) : SIGTERM;
      log_.say("stopped by " + std::string(g_stop_signal == SIGINT ? "SIGINT" : "SIGTERM") + " after step " +
               std::to_string(step + 1) +
               (saved ? "; saved in " + checkpointer_->dir() + "; resume with --out-dir " + paths_.folder.dir +
                            (checkpointer_->dir() == paths_.folder.checkpoints() ? "" : " --ckpt-dir " + checkpointer_->dir())
                      : "; no checkpoint of this step was saved (see above)"));
      return summary_;
    }
  }
  checkpointer_->wait_for_save(metrics_.get());  // the last one, written in the background, published
  // Every step skipped means no update was applied: not a success.
  const int64_t trained = last_step_ - start_step_;
  FSDP_CHECK(trained == 0 || guard_->skipped() < trained, "every one of this run's ", trained,
             " steps was skipped (see the step lines above for why): no update was applied, so nothing is saved or "
             "exported");
  finish_run();
  return summary_;
}

int64_t Trainer::tokens_per_step() const { return config_.tokens_per_step(world_->size()); }

torch::Tensor Trainer::lm_loss(const torch::Tensor& hidden, const torch::Tensor& targets) const {
  return config_.model.chunk_loss ? nn::chunked_lm_loss(hidden, model_->output_weight(), targets)
                                  : nn::lm_loss(hidden, model_->output_weight(), targets);
}

namespace {

// Puts the starting values into each (parameter, starting value) pair's
// parameter (its local shard) for the scope's life, then the trained ones
// back: a few MB of adapters, copied twice a micro-step.
class StartingAdaptersIn {
 public:
  explicit StartingAdaptersIn(const std::vector<std::pair<torch::Tensor, torch::Tensor>>& pairs) : pairs_(pairs) {
    torch::NoGradGuard no_grad;
    for (const auto& [param, start] : pairs_) {
      trained_.push_back(param.detach().clone());
      param.detach().copy_(start);
    }
  }
  ~StartingAdaptersIn() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < trained_.size(); ++i) pairs_[i].first.detach().copy_(trained_[i]);
  }
  StartingAdaptersIn(const StartingAdaptersIn&) = delete;
  StartingAdaptersIn& operator=(const StartingAdaptersIn&) = delete;

 private:
  const std::vector<std::pair<torch::Tensor, torch::Tensor>>& pairs_;
  std::vector<torch::Tensor> trained_;
};

}  // namespace

PreferenceTerms Trainer::preference_terms_of(const data::Batch& batch) {
  torch::Tensor reference;
  {
    // The reference's forward first: a no-grad forward leaves every unit
    // resharded, and the policy's forward then runs as any step's does.
    RECORD_USER_SCOPE("train::reference_forward");
    memory::set_phase("reference");
    torch::NoGradGuard no_grad;
    const auto score = [&](models::CausalLM& m) {
      return fsdp::run(m, [&] { return nn::sequence_log_probs(m->forward(batch.inputs), m->output_weight(), batch.targets); });
    };
    if (reference_) {
      reference = score(reference_);
    } else {
      // The policy's own model, as the run started: the adapters
      // --lora-init-from gave (TRL's frozen "ref" adapter), or fresh
      // adapters off; without dropout, as TRL's DPOTrainer disables it.
      std::optional<StartingAdaptersIn> swapped;
      std::optional<nn::AdaptersOff> off;
      if (!starting_adapters_.empty()) {
        swapped.emplace(starting_adapters_);
      } else {
        off.emplace();
      }
      const bool training = model_->is_training();
      model_->eval();
      reference = score(model_);
      model_->train(training);
    }
  }
  memory::set_phase("forward");
  torch::Tensor policy;
  if (torch::GradMode::is_enabled()) {
    const torch::Tensor hidden = fsdp::call(model_, batch.inputs);
    memory::set_phase("loss");
    policy = nn::sequence_log_probs(hidden, model_->output_weight(), batch.targets);
  } else {
    policy = fsdp::run(model_, [&] {
      return nn::sequence_log_probs(model_->forward(batch.inputs), model_->output_weight(), batch.targets);
    });
  }
  return preference_terms(policy, reference, batch.targets.ne(-100).sum(1), config_.objective);
}

Trainer::Losses Trainer::loss_of(const data::Batch& batch) {
  Losses losses;
  if (dpo()) {
    const PreferenceTerms terms = preference_terms_of(batch);
    preference_stats_.add(terms);
    losses.lm = terms.losses.mean();
    const torch::Tensor aux = model_->auxiliary_loss();
    losses.trained = aux.defined() ? losses.lm + aux : losses.lm;
    return losses;
  }
  memory::set_phase("forward");
  const torch::Tensor hidden = fsdp::call(model_, batch.inputs);
  memory::set_phase("loss");
  losses.lm = lm_loss(hidden, batch.targets);
  // The MoE load-balancing loss trains the routers; "loss" reports the
  // language-model loss alone, comparable across models and with val loss.
  const torch::Tensor aux = model_->auxiliary_loss();
  losses.trained = aux.defined() ? losses.lm + aux : losses.lm;
  return losses;
}

Trainer::StepStats Trainer::train_step(int64_t step) {
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(schedule_.at(step));
  }
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  const auto start = Clock::now();
  // The flight recorder is the one record of collectives: this step's
  // are the difference of its running totals.
  const auto comm_before = dist::FlightRecorder::instance().totals();
  const int64_t A = config_.data.grad_accum;
  double loss_sum = 0, aux_sum = 0, data_s = 0, forward_backward_s = 0;
  // [Note: the loss of chat data]: each trained target weighs the same
  // across micro-steps and ranks, so the step needs the global count first.
  const bool examples = train_data_->examples() > 0;
  // Preference pairs weigh alike, as TRL's mean over a batch's pairs: every
  // micro-batch holds B of them.
  const bool by_tokens = examples && !dpo();
  preference_stats_ = {};
  std::vector<data::Batch> batches;
  double trained_in_step = 0;
  int64_t real_in_step = tokens_per_step();
  if (examples) {
    const auto t = Clock::now();
    memory::set_phase("data");
    // Trained targets and real input tokens, summed over micro-steps and ranks.
    auto count = torch::zeros({2}, torch::kDouble);
    for (int a = 0; a < A; ++a) {
      batches.push_back(train_data_->batch(step, a));
      count[0] += static_cast<double>(batches.back().trained_targets);
      count[1] += static_cast<double>(batches.back().real_tokens);
    }
    dist::all_reduce(world_->group(), count, dist::ReduceOp::kSum).wait();
    trained_in_step = count[0].item<double>();
    real_in_step = static_cast<int64_t>(count[1].item<double>());
    data_s += seconds_since(t);
  }
  for (int a = 0; a < A; ++a) {
    // Reduce gradients once per optimizer step, on the last micro-step, or
    // every micro-step into the shards (--accumulate sharded).
    set_requires_gradient_sync(*model_, config_.fsdp.accumulate == Accumulate::kSharded || a == A - 1);
    auto t = Clock::now();
    memory::set_phase("data");
    data::Batch batch = examples ? std::move(batches[static_cast<size_t>(a)]) : train_data_->batch(step, a);
    // A micro-batch whose rows train nothing still runs (its collectives
    // are every rank's), weighing 0; one target keeps its mean finite.
    if (by_tokens && batch.trained_targets == 0) batch.targets.view({-1}).narrow(0, 0, 1).fill_(0);
    const double weight = !by_tokens ? 1.0 / static_cast<double>(A)
                          : trained_in_step > 0
                              ? static_cast<double>(batch.trained_targets) * world_->size() / trained_in_step
                              : 0.0;
    data_s += seconds_since(t);
    t = Clock::now();
    // Named ranges split a profiled step (--profile-steps) by phase.
    Losses losses;
    // Packed rows (--pack): positions and attention inside each example,
    // for the forward and for the backward that may recompute it.
    const nn::PackedRows packed{batch.positions, batch.example_starts};
    std::optional<nn::PackedRowsScope> packed_scope;
    if (batch.positions.defined()) packed_scope.emplace(packed);
    {
      RECORD_USER_SCOPE("train::forward");
      losses = loss_of(batch);
    }
    // The synchronised backward: units' updates start as it goes.
    if (host_step_ && a == A - 1) host_step_->arm();
    {
      RECORD_USER_SCOPE("train::backward");
      memory::set_phase("backward");
      const torch::Tensor aux = model_->auxiliary_loss();
      const torch::Tensor loss = !by_tokens      ? losses.trained / static_cast<double>(A)
                                 : aux.defined() ? losses.lm * weight + aux / static_cast<double>(A)
                                                 : losses.lm * weight;
      (scaler_ ? scaler_->scale(loss) : loss).backward();
    }
    loss_sum += losses.lm.item<double>() * weight;
    if (const torch::Tensor aux = model_->auxiliary_loss(); aux.defined()) aux_sum += aux.item<double>() / static_cast<double>(A);
    forward_backward_s += seconds_since(t);
  }
  const auto optimizer_start = Clock::now();
  RECORD_USER_SCOPE("train::optimizer");
  memory::set_phase("optimizer");
  if (scaler_) scaler_->unscale_(*optimizer_);
  // Clipping's factor is applied by the optimizer as it reads each
  // gradient (one pass fewer over them), or in place before the scaler.
  const double grad_norm = fsdp::grad_norm(*model_);
  const double clip = clip_factor(grad_norm, config_.optim.grad_clip);
  const double loss = mean_over_ranks(world_->group(), loss_sum);
  const StepVerdict verdict = guard_->judge(loss, grad_norm);
  if (host_step_) {
    host_step(clip);  // the updates began in backward; waits for the last
    FSDP_CHECK(!verdict.skip, "step ", step + 1, ": ", verdict.reason, ", and with --overlap-host-step its update was "
               "already made during backward: the run stops here without saving; resume from the last checkpoint "
               "(without --overlap-host-step a non-finite step is skipped instead)");
  } else if (verdict.skip) {
    if (scaler_) scaler_->update();
  } else if (scaler_) {
    scale_gradients(*model_, clip);
    scaler_->step(*optimizer_);
    scaler_->update();
  } else if (config_.fsdp.cpu_offload || config_.fsdp.optimizer_offload) {
    host_step(clip);
  } else {
    optimizer_->step_scaled(clip);
  }
  compat::zero_grad_to_none(*optimizer_);
  const double optimizer_s = seconds_since(optimizer_start);
  tokens_seen_ += tokens_per_step();
  const auto comm = dist::FlightRecorder::instance().totals();
  StepStats stats{loss,   grad_norm,          seconds_since(start), static_cast<double>(comm.blocked_ns - comm_before.blocked_ns) * 1e-9,
                  data_s, forward_backward_s, optimizer_s,          verdict};
  stats.collectives = comm.labeled - comm_before.labeled;
  stats.real_tokens = real_in_step;
  stats.trained_tokens = examples ? static_cast<int64_t>(trained_in_step) : real_in_step;
  stats.comm_bytes = comm.labeled_bytes - comm_before.labeled_bytes;
  if (model_->auxiliary_loss().defined()) stats.aux_loss = mean_over_ranks(world_->group(), aux_sum);
  if (dpo()) {
    preference_stats_.sum_over(world_->group());
    stats.preference = preference_stats_;
  }
  return stats;
}

// `step` is the last one recorded; -1: the run failed during a step.
void Trainer::write_memory_snapshot(int64_t step) {
  const memory::Recording recording = memory::stop_recording();
  const std::string path = paths_.folder.memory_snapshot(world_->rank());
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  const std::string steps = "steps " + std::to_string(start_step_ + 1) +
                            (step >= 0 ? " to " + std::to_string(step + 1) : " until the error");
  const std::string where = path + (world_->size() > 1 ? " (one per rank beside it)" : "");
  if (world_->device().is_cuda()) {
    // The GPU's own allocator history: what a GPU run's memory is.
    io::write_file_atomically(path, stop_device_memory_history());
    char peak[64];
    std::snprintf(peak, sizeof(peak), "%.1f MiB",
                  static_cast<double>(peak_device_bytes(world_->device())) / (1 << 20));
    log_.say("GPU memory snapshot of " + steps + ": " + where + "; peak " + peak +
             " of tensors (python -m torch.cuda._memory_viz trace_plot FILE -o FILE.html, or pytorch.org/memory_viz)");
    return;
  }
  memory::write_memory_snapshot(recording, world_->rank(), path);
  const std::string peak_phase =
      recording.peak_event >= 0 ? recording.phases[static_cast<size_t>(recording.events[static_cast<size_t>(recording.peak_event)].phase)]
                                : "before the first step";
  char peak[64];
  std::snprintf(peak, sizeof(peak), "%.1f MiB", static_cast<double>(recording.peak_bytes) / (1 << 20));
  log_.say("memory snapshot of " + steps + ": " + where + "; peak " + peak + " of tensors, in '" +
           peak_phase + "' (python -m torch.cuda._memory_viz trace_plot FILE -o FILE.html, or pytorch.org/memory_viz)");
}

void Trainer::after_step(int64_t step, const StepStats& stats) {
  const int64_t total = config_.runtime.steps;
  summary_.train_losses.push_back(stats.loss);
  guard_->record(stats.loss, stats.verdict);
  if (log_cadence_.due(step, total)) log_step(step, stats);
  // A lower validation loss under --keep-best counts as the best once its
  // checkpoint is written (below); otherwise it is noted at once.
  bool save_as_best = false;
  double val = 0;
  if (val_data_ && (eval_cadence_.due(step, total) || (config_.eval.every_epoch && ended_an_epoch()))) {
    val = evaluate_and_log(step + 1);
    const bool lower = val < best_val_;
    save_as_best = lower && config_.eval.keep_best && !stats.verdict.skip;
    if (!save_as_best) note_validation_loss(step + 1, val, lower && !config_.eval.keep_best);
  }
  if (stats.verdict.skip) {
    guard_->stop_if_too_many_bad(step, stats.loss, stats.grad_norm,
                                 checkpointer_->enabled() ? " (the latest checkpoint holds them or earlier ones)" : "");
    log_.say("step " + std::to_string(step + 1) + ": loss " + std::to_string(stats.loss) + ", gradient norm " +
             std::to_string(stats.grad_norm) + ": " + stats.verdict.reason + ", optimizer step skipped");
  }
  // A skipped step left the state as the last good step did: it is not
  // saved, so `latest` always names a step that trained.
  stop_requested_ = stop_requested(world_->group(), step);
  // A stop (Ctrl-C, a scheduler's SIGTERM) keeps the work: a run that saves
  // no checkpoints otherwise saves this one into its run folder.
  if (stop_requested_ && step + 1 < total && !checkpointer_->enabled() && checkpointable()) {
    checkpointer_->redirect(paths_.folder.checkpoints());
  }
  if (!stats.verdict.skip && (save_as_best || checkpointer_->due(step, total, stop_requested_ || stopped_early_))) {
    // The checkpoint of the step that sets a new best records it: a run
    // resumed from it, or killed before the mark below, knows its best.
    checkpointer_->save(state_to_save(step + 1, save_as_best ? std::optional<double>(val) : std::nullopt), *model_,
                        *optimizer_, metrics_.get());
  }
  if (save_as_best) {
    checkpointer_->mark_best(step + 1, metrics_.get());
    note_validation_loss(step + 1, val, checkpointer_->last_saved_step() == step + 1);
  }
}

void Trainer::note_validation_loss(int64_t steps_done, double val, bool improved) {
  if (improved) {
    best_val_ = val;
    best_step_ = steps_done;
    evals_since_best_ = 0;
  } else {
    ++evals_since_best_;
  }
  const int64_t patience = config_.eval.patience;
  if (patience > 0 && evals_since_best_ >= patience && steps_done < config_.runtime.steps) {
    stopped_early_ = true;
    char line[160];
    std::snprintf(line, sizeof(line), "stopping early: %lld evaluation(s) without a validation loss below %.4f (step %lld; --patience %lld)",
                  static_cast<long long>(evals_since_best_), best_val_, static_cast<long long>(best_step_),
                  static_cast<long long>(patience));
    log_.say(line);
    if (metrics_) {
      metrics_->write({{"event", "early_stop"}, {"step", steps_done}, {"best_step", best_step_}, {"best_val_loss", best_val_}});
    }
  }
}

void Trainer::restore_best() {
  if (!config_.eval.keep_best || best_step_ == 0 || best_step_ == last_step_) return;  // the weights in hand
  const std::string path = checkpointer_->best();
  if (std::filesystem::path(path).filename().string() != step_dir_name(best_step_)) {
    log_.warn("--keep-best: the best validation loss was step " + std::to_string(best_step_) + "'s, but " +
              (path.empty() ? std::string("no checkpoint is marked best") : "'best' names " + path) +
              "; the sample and export hold the last step's weights");
    return;
  }
  checkpoint::load(path, checkpointer_->parts(*model_, *optimizer_), *world_);
  restored_best_ = true;
  char line[200];
  std::snprintf(line, sizeof(line), "the best checkpoint (step %lld, val loss %.4f) is what this run's sample and export hold: ",
                static_cast<long long>(best_step_), best_val_);
  log_.say(line + path);
}

void Trainer::log_step(int64_t step, const StepStats& s) {
  // Real tokens, not padding: one example a row pads each micro-batch to
  // its longest row, and a packed row's tail is padding.
  const double tokens_per_s = static_cast<double>(s.real_tokens) / s.seconds;
  const double flops_per_token = training_flops_per_token(active_params_, model_->n_layers(), config_.data.seq_len, model_->dim());
  const double achieved = flops_per_token * tokens_per_s / world_->size();
  if (achieved > peak_flops_) {
    // The probe's matmul shape ran slower than the model's: the rate this
    // step reached is a better peak, so MFU never exceeds 1.
    log_.note("peak FLOP/s raised from " + std::to_string(peak_flops_) + " to " + std::to_string(achieved) +
              " (step " + std::to_string(step + 1) + " reached it)");
    peak_flops_ = achieved;
  }
  const auto mem = memory_stats(*model_, optimizer_.get());
  if (!metrics_) return;
  nlohmann::json line = {{"step", step + 1},
                         {"loss", s.loss},
                         {"lr", schedule_.at(step)},
                         {"grad_norm", s.grad_norm},
                         {"tokens_per_s", tokens_per_s},
                         {"tokens", s.real_tokens},
                         {"trained_tokens", s.trained_tokens},
                         {"mfu", achieved / peak_flops_},
                         {"step_time_s", s.seconds},
                         {"comm_wait_s", s.comm_seconds},
                         {"skipped", s.verdict.skip},
                         {"skipped_steps", guard_->skipped()},
                         {"fsdp_collectives", s.collectives},
                         {"fsdp_comm_mb", static_cast<double>(s.comm_bytes) / (1 << 20)},
                         {"data_s", s.data_seconds},
                         {"forward_backward_s", s.forward_backward_seconds},
                         {"optimizer_s", s.optimizer_seconds},
                         {"peak_rss_mb", static_cast<double>(peak_rss_bytes()) / (1 << 20)},
                         {"sharded_state_mb", static_cast<double>(mem.sharded_param_bytes + mem.grad_bytes +
                                                                  mem.optimizer_state_bytes) / (1 << 20)},
                         {"host_state_mb", static_cast<double>(mem.host_param_bytes + mem.host_grad_bytes +
                                                               mem.host_optimizer_state_bytes) / (1 << 20)},
                         {"peak_gathered_mb", static_cast<double>(mem.peak_gathered_bytes) / (1 << 20)},
                         {"allocated_peak_mb", static_cast<double>(memory::peak_allocated_bytes()) / (1 << 20)},
                         {"tokens_seen", tokens_seen_}};
  if (s.aux_loss) line["aux_loss"] = *s.aux_loss;
  if (s.preference) {
    for (const auto& [name, value] : s.preference->means()) line[name] = value;
  }
  // On a GPU: the caching allocator's peak, what torch.cuda.max_memory_allocated reports.
  if (world_->device().is_cuda()) {
    line["peak_device_mb"] = static_cast<double>(peak_device_bytes(world_->device())) / (1 << 20);
  }
  metrics_->write(line);
  std::string extra;
  if (s.preference) {
    const auto means = s.preference->means();  // chosen, rejected, accuracies, margins, ...
    char text[96];
    std::snprintf(text, sizeof(text), "reward acc %.2f  margin %.4f", means[2].second, means[3].second);
    extra = text;
  }
  log_.step(step, s.loss, tokens_per_s, schedule_.at(step), s.grad_norm, s.seconds, extra);
}

void Trainer::host_step(double clip) {
  std::string failure;
  try {
    if (host_step_) {
      const size_t stepped = host_step_->finish();
      size_t expected = 0;
      for (const auto& group : optimizer_->param_groups()) {
        for (const auto& p : group.params()) expected += p.grad().defined() ? 1 : 0;
      }
      FSDP_CHECK(stepped == expected, "--overlap-host-step updated ", stepped, " of the ", expected,
                 " parameters with gradients during backward");
    } else {
      fault_point("train.host_step");
      optimizer_->step_scaled(clip);
    }
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // Every rank learns of a failure on any, before any goes on: the others
  // would otherwise wait in the next step's first collective.
  auto failed = torch::tensor({failure.empty() ? 0.0 : 1.0}, torch::kDouble);
  dist::all_reduce(world_->group(), failed, dist::ReduceOp::kMax).wait();
  FSDP_CHECK(failure.empty(), "the optimizer's step on the host failed: ", failure,
             "; units whose update had not begun are as they were, and no checkpoint is written past the last one");
  FSDP_CHECK(failed.item<double>() == 0.0, "the optimizer's step on the host failed on another rank (its log says "
             "why); this rank stops with it, and no checkpoint is written past the last one");
}

namespace {

// The rows an epoch of `data` reads: its examples or packed rows, or its
// windows of T tokens (+1 for the last target).
int64_t rows_of(const data::DataLoader& data, int64_t seq_len) {
  if (data.examples() > 0) return data.rows();
  return std::max<int64_t>(1, (data.tokens_in_files() - 1) / seq_len);
}

}  // namespace

bool Trainer::ended_an_epoch() const {
  // The step just taken read the global rows [before, after) of the
  // training data's stream of rows (tokens_seen_ counts T a row).
  const int64_t T = config_.data.seq_len, n = rows_of(*train_data_, T);
  const int64_t after = tokens_seen_ / T, before = (tokens_seen_ - tokens_per_step()) / T;
  return after / n > before / n;
}

double Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  model_->eval();
  double sum = 0, trained = 0;
  const bool examples = val_data_->examples() > 0;
  // --eval-batches all: every row of the validation data once. The last
  // batch's rows past the end (they wrap to the first) count nothing.
  const bool whole = config_.eval.batches == 0;
  const int64_t T = config_.data.seq_len, rows = rows_of(*val_data_, T);
  const int64_t batches =
      whole ? (rows + config_.data.batch_size * world_->size() - 1) / (config_.data.batch_size * world_->size())
            : config_.eval.batches;
  if (dpo()) {
    // The mean loss over the pairs scored; the last batch's pairs past the
    // end of the set (--eval-batches all) are its tail, left out.
    PreferenceStats stats;
    double loss_sum = 0;
    for (int64_t e = 0; e < batches; ++e) {
      PreferenceTerms terms = preference_terms_of(val_data_->batch(e, 0));
      const int64_t first = val_data_->offset(e, 0) / T;
      const int64_t kept = whole ? std::clamp<int64_t>(rows - first, 0, config_.data.batch_size) : config_.data.batch_size;
      for (torch::Tensor* t : {&terms.losses, &terms.chosen_rewards, &terms.rejected_rewards, &terms.chosen_logps,
                               &terms.rejected_logps}) {
        *t = t->narrow(0, 0, kept);
      }
      stats.add(terms);
      loss_sum += terms.losses.sum().item<double>();
    }
    model_->train();
    stats.sum_over(world_->group());
    eval_preference_ = stats;
    return mean_over_ranks(world_->group(), loss_sum) * world_->size() / std::max(stats.pairs, 1.0);
  }
  for (int64_t e = 0; e < batches; ++e) {
    data::Batch batch = val_data_->batch(e, 0);
    if (whole) {
      const int64_t first = val_data_->offset(e, 0) / T;  // this rank's first row, in the stream of rows
      for (int64_t b = 0; b < config_.data.batch_size; ++b) {
        if (first + b < rows) continue;
        auto row = batch.targets[b];
        batch.trained_targets -= row.ne(-100).sum().item<int64_t>();
        row.fill_(-100);
      }
    }
    if ((examples || whole) && batch.trained_targets == 0) batch.targets.view({-1}).narrow(0, 0, 1).fill_(0);
    const nn::PackedRows packed{batch.positions, batch.example_starts};
    std::optional<nn::PackedRowsScope> packed_scope;
    if (batch.positions.defined()) packed_scope.emplace(packed);
    // The loss uses the output head: inside the root's call, where it is gathered.
    const double mean =
        fsdp::run(model_, [&] { return lm_loss(model_->forward(batch.inputs), batch.targets); }).item<double>();
    const bool weighted = examples || whole;
    sum += weighted ? (batch.trained_targets > 0 ? mean : 0.0) * static_cast<double>(batch.trained_targets) : mean;
    trained += static_cast<double>(batch.trained_targets);
  }
  model_->train();
  if (!examples && !whole) return mean_over_ranks(world_->group(), sum / static_cast<double>(batches));
  // Chat data: the mean over every trained target of every rank's batches.
  auto totals = torch::tensor({sum, trained}, torch::kDouble);
  dist::all_reduce(world_->group(), totals, dist::ReduceOp::kSum).wait();
  return totals[0].item<double>() / std::max(totals[1].item<double>(), 1.0);
}

double Trainer::evaluate_and_log(int64_t steps_done) {
  const double val = evaluate();
  summary_.val_losses.push_back(val);
  nlohmann::json record = {{"split", "val"}, {"step", steps_done}, {"loss", val}};
  char line[160];
  std::snprintf(line, sizeof(line), "step %lld: val loss %.4f", static_cast<long long>(steps_done), val);
  std::string text = line;
  if (dpo()) {
    const auto means = eval_preference_.means();
    for (const auto& [name, value] : means) record[name] = value;
    std::snprintf(line, sizeof(line), "  reward acc %.2f  margin %.4f", means[2].second, means[3].second);
    text += line;
  }
  log_.say(text);
  if (config_.eval.samples > 0) record["samples"] = validation_samples(steps_done);
  if (metrics_) metrics_->write(record);
  return val;
}

nlohmann::json Trainer::validation_samples(int64_t steps_done) {
  const int64_t T = config_.data.seq_len;
  const int64_t n = std::min(config_.eval.samples, rows_of(*val_data_, T));
  SampleOptions options;
  options.max_new_tokens = config_.eval.sample_max_tokens;
  options.temperature = 0;  // greedy: evaluations compare, so the same prompt gets the same answer
  options.stop_ids = end_of_text_ids(companion_sources(config_));
  nlohmann::json out = nlohmann::json::array();
  std::string markdown;
  for (int64_t k = 0; k < n; ++k) {
    // Chat data: the example up to its answer (the context the model was
    // trained to answer); a token stream: a row's first 32 tokens.
    const auto prompt = val_data_->sample_prompt(k, val_data_->examples() > 0 ? T : 32);
    if (prompt.empty()) continue;
    const auto ids = generate(model_, prompt, options);
    const std::string prompt_text = tokenizer_->decode(prompt);
    const std::string completion = tokenizer_->decode_continuation(prompt, ids);
    out.push_back({{"prompt", prompt_text}, {"completion", completion}});
    log_.say("--- validation sample " + std::to_string(k + 1) + " of " + std::to_string(n) + " (step " +
             std::to_string(steps_done) + ") ---\n" + prompt_text + completion + "\n---");
    // Markdown: code blocks keep the template's line breaks and markup.
    markdown += "**" + std::to_string(k + 1) + ".** prompt:\n\n```\n" + prompt_text + "\n```\n\ncompletion:\n\n```\n" +
                completion + "\n```\n\n";
  }
  if (metrics_) metrics_->text(steps_done, "val/samples", markdown);
  return out;
}

checkpoint::TrainerState Trainer::state_to_save(int64_t steps_done, std::optional<double> new_best_val) const {
  checkpoint::TrainerState state;
  state.step = steps_done;
  state.tokens_seen = tokens_seen_;
  state.loss_scale = scaler_ ? scaler_->get_scale() : 0.0;
  state.config_yaml = config_.to_yaml();
  if (new_best_val) {
    state.extra["best_val_loss"] = *new_best_val;
    state.extra["best_step"] = steps_done;
    state.extra["evals_since_best"] = 0;
  } else if (best_step_ > 0) {
    state.extra["best_val_loss"] = best_val_;
    state.extra["best_step"] = best_step_;
    state.extra["evals_since_best"] = evals_since_best_;
  }
  if (stopped_early_) state.extra["stopped_early"] = true;
  if (config_.lora.rank > 0) state.extra["lora_base"] = lora_base_;
  try {
    state.hf_config = models::hf_config(*model_).dump(2);
  } catch (const Error&) {
    // A model without a Hugging Face equivalent: the checkpoint still resumes.
  }
  return state;  // the sharding and mesh: checkpoint::save records them from the model
}

void Trainer::finish_run() {
  log_.finish();
  if (checkpointer_->failed_saves() > 0) {
    log_.warn(std::to_string(checkpointer_->failed_saves()) +
              " checkpoint save(s) failed in this run (--on-save-error continue); see the warnings above");
  }
  // The trained state is on disk before anything that could still fail.
  try {
    restore_best();
    if (config_.sample.tokens > 0) summary_.sample = sample_text();
    if (!config_.hf_export.dir.empty()) export_hf();
  } catch (const std::exception& e) {
    // (Weights restored from the best checkpoint are on disk as that one.)
    if (!restored_best_ && checkpointer_->last_saved_step() != last_step_ && checkpointable()) {
      checkpointer_->redirect(paths_.folder.checkpoints());
      checkpointer_->save(state_to_save(last_step_), *model_, *optimizer_, metrics_.get());
      checkpointer_->wait_for_save(metrics_.get());
      throw Error(std::string(e.what()) + " (the trained weights were saved to " + paths_.folder.checkpoints() +
                  (config_.lora.rank > 0 ? "; resume the run with --export-hf DIR to export them)"
                                         : "; `fsdp ckpt export` writes them in Hugging Face's format)"));
    }
    throw;
  }
}

std::string Trainer::sample_text() {
  SampleOptions options;
  options.max_new_tokens = config_.sample.tokens;
  options.seed = static_cast<uint64_t>(config_.runtime.seed);
  // A sample ends where the model says its text ends, as `fsdp generate` does.
  options.stop_ids = end_of_text_ids(companion_sources(config_));
  const auto ids = generate(model_, sample_prompt_, options);
  std::string text = tokenizer_->decode_continuation(sample_prompt_, ids);
  log_.say("--- sample (" + std::to_string(ids.size()) + " tokens) ---\n" + config_.sample.prompt + text + "\n---");
  return text;
}

void Trainer::export_hf() {
  export_trained_model(*model_, config_, companion_sources(config_), *world_, log_);
}

}  // namespace fsdp::train
