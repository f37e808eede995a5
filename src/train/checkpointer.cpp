#include "fsdp/train/checkpointer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/distributed/launch_env.h"

namespace fsdp::train {
namespace {

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

}  // namespace

std::string step_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

namespace {

// The step_N directories under `dir`, oldest first.
std::vector<std::string> step_dirs(const std::string& dir) {
  namespace fs = std::filesystem;
  static const std::regex kStep("step_[0-9]+");
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, kStep)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// "key: old -> new" differences a resume is expected to make.
const char* const kMayDiffer[] = {"runtime.steps:", "runtime.out_dir:", "runtime.run_name:", "logging.metrics:",
                                  "checkpoint."};

}  // namespace

Checkpointer::Checkpointer(TrainConfig::Checkpoint& config, dist::World& world, RunLog& log)
    : config_(config), world_(world), log_(log) {}

bool Checkpointer::may_differ(const std::string& difference) {
  return std::any_of(std::begin(kMayDiffer), std::end(kMayDiffer),
                     [&](const char* prefix) { return difference.rfind(prefix, 0) == 0; });
}

std::string Checkpointer::intact_checkpoints(const std::string& except) const {
  // Reading every file of every checkpoint once is enough: rank 0 does it.
  if (world_.rank() != 0) return "rank 0's error names the checkpoints still intact";
  std::string intact;
  for (const auto& name : step_dirs(config_.dir)) {
    const std::string path = config_.dir + "/" + name;
    if (path == except || !checkpoint::damage(path).empty()) continue;
    intact += (intact.empty() ? "" : ", ") + name;
  }
  return intact.empty() ? "no intact checkpoint is left in '" + config_.dir + "'"
                        : "intact: " + intact + " (resume from one with --resume-from STEP)";
}

void Checkpointer::set_aside_newer_than(int64_t step) const {
  namespace fs = std::filesystem;
  if (world_.rank() != 0) return;
  for (const auto& name : step_dirs(config_.dir)) {
    if (name <= step_dir_name(step)) continue;
    // A second --resume-from to the same step finds the first one's names
    // taken: superseded-2-..., -3-... (the earlier sets stay, untouched).
    std::string aside = "superseded-" + name;
    for (int n = 2; fs::exists(config_.dir + "/" + aside); ++n) aside = "superseded-" + std::to_string(n) + "-" + name;
    fs::rename(config_.dir + "/" + name, config_.dir + "/" + aside);
    log_.say("--resume-from " + std::to_string(step) + ": " + config_.dir + "/" + name + " renamed " + aside +
             " (this run trains those steps again)");
  }
  // A best set aside is no longer this run's best (the resumed checkpoint's record says which is).
  std::ifstream best(config_.dir + "/best");
  std::string named;
  if (best.good() && std::getline(best, named) && named > step_dir_name(step)) fs::remove(config_.dir + "/best");
}

std::string Checkpointer::chosen_checkpoint() const {
  // A restarted attempt (fsdp launch --max-restarts) continues from what
  // the failed attempt saved: --resume-from chose where the job began.
  const char* attempt = std::getenv(dist::kRestartAttemptVar);
  const bool restarted = attempt != nullptr && std::atoi(attempt) > 0;
  if (config_.resume_from > 0 && !restarted) {
    const std::string path = config_.dir + "/" + step_dir_name(config_.resume_from);
    FSDP_CHECK(std::filesystem::is_directory(path), "--resume-from ", config_.resume_from, ": '", config_.dir,
               "' holds no checkpoint of that step; ", intact_checkpoints(""));
    return path;
  }
  std::optional<std::string> found;
  try {
    found = checkpoint::latest(config_.dir);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + "; " + intact_checkpoints(""));
  }
  FSDP_CHECK(found || !config_.resume, "--resume: '", config_.dir, "' holds no checkpoint (no 'latest')");
  return found.value_or("");
}

checkpoint::Parts Checkpointer::parts(torch::nn::Module& model, torch::optim::Optimizer& optimizer) const {
  auto parts = checkpoint::Parts().model("", model).optimizer("optimizer", optimizer);
  if (leave_out_frozen_) parts.leave_out_frozen();
  return parts;
}

std::optional<checkpoint::TrainerState> Checkpointer::resume(torch::nn::Module& model, torch::optim::AdamW& optimizer,
                                                             const TrainConfig& now) {
  if (!enabled()) {
    FSDP_CHECK(!config_.resume && config_.resume_from == 0,
               config_.resume ? "--resume" : "--resume-from",
               ": no checkpoint directory (--ckpt-dir, or checkpoints/ in --out-dir)");
    return std::nullopt;
  }
  const std::string path = chosen_checkpoint();
  if (path.empty()) return std::nullopt;
  const auto start = std::chrono::steady_clock::now();
  checkpoint::TrainerState state;
  try {
    state = checkpoint::load(path, parts(model, optimizer), world_);
  } catch (const Error& e) {
    const std::string what = e.what();
    // Another model's checkpoints are another run's: no step of them helps.
    if (what.find("from another model") != std::string::npos) {
      throw Error(what + "; '" + config_.dir +
                  "' holds another run's checkpoints: train this model with another --out-dir (or --ckpt-dir)");
    }
    throw Error(what + "; " + intact_checkpoints(path));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  FSDP_CHECK(state.step <= now.runtime.steps, "checkpoint '", path, "' is at step ", state.step,
             ", beyond runtime.steps = ", now.runtime.steps);
  last_saved_step_ = state.step;
  if (config_.resume_from > 0 && path == config_.dir + "/" + step_dir_name(config_.resume_from)) {
    set_aside_newer_than(state.step);
  }
  const int64_t saved_by = state.mesh.size() == 2 ? state.mesh[0] * state.mesh[1] : 0;
  char line[1024];
  std::snprintf(line, sizeof(line), "resumed from %s at step %lld (saved by %lld rank(s) under %s; loaded in %.2f s)",
                path.c_str(), static_cast<long long>(state.step), static_cast<long long>(saved_by),
                state.sharding.c_str(), seconds);
  log_.say(line);
  report_differences(state, path, now);
  return state;
}

void Checkpointer::report_differences(const checkpoint::TrainerState& state, const std::string& path,
                                      const TrainConfig& now) {
  if (state.config_yaml.empty()) return;
  TrainConfig saved;
  try {
    saved.load_yaml_text(state.config_yaml, path + "/metadata.json");
  } catch (const Error&) {
    return;  // a configuration from another version: nothing to compare
  }
  std::vector<std::string> changed;
  for (const auto& d : saved.differences(now)) {
    if (!may_differ(d)) changed.push_back(d);
  }
  if (!changed.empty()) {
    log_.say("note: this run's configuration differs from the checkpoint's:");
    for (const auto& d : changed) log_.say("  " + d);
  }
  // The world size is no configuration key, but the global batch follows
  // it: say when it changes (the learning rate was tuned for the old one).
  const int64_t saved_world = state.mesh.size() == 2 ? state.mesh[0] * state.mesh[1] : 0;

  const int64_t world = world_.size();
  if (saved_world > 0 && saved.tokens_per_step(saved_world) != now.tokens_per_step(world)) {
    char line[512];
    std::snprintf(line, sizeof(line),
                  "note: the global batch changes from %lld tokens per step (%lld ranks x %lld x %lld x %lld) to %lld "
                  "(%lld ranks x %lld x %lld x %lld: ranks x batch size x accumulation x sequence length)",
                  static_cast<long long>(saved.tokens_per_step(saved_world)), static_cast<long long>(saved_world),
                  static_cast<long long>(saved.data.batch_size), static_cast<long long>(saved.data.grad_accum),
                  static_cast<long long>(saved.data.seq_len), static_cast<long long>(now.tokens_per_step(world)),
                  static_cast<long long>(world), static_cast<long long>(now.data.batch_size),
                  static_cast<long long>(now.data.grad_accum), static_cast<long long>(now.data.seq_len));
    log_.say(line);
  }
}

void Checkpointer::mark_best(int64_t step, MetricsLog* metrics) {
  wait_for_save(metrics);
  if (last_saved_step_ != step) return;  // not written (weights not finite, a save that failed): the best stays
  if (world_.rank() == 0) checkpoint::mark_best(config_.dir, config_.dir + "/" + step_dir_name(step), static_cast<int>(config_.keep));
  dist::barrier(world_.group());
}

bool Checkpointer::repair_best(int64_t step) {
  if (!enabled() || step <= 0) return false;
  const std::string path = config_.dir + "/" + step_dir_name(step);
  if (std::filesystem::path(best()).filename().string() == step_dir_name(step)) return true;
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec) || std::filesystem::is_symlink(path, ec)) return false;
  if (world_.rank() == 0) checkpoint::mark_best(config_.dir, path, static_cast<int>(config_.keep));
  dist::barrier(world_.group());
  log_.say("--keep-best: the checkpoint of step " + std::to_string(step) + " set the best validation loss and was "
           "not yet marked best (the run stopped first): marked now");
  return true;
}

std::string Checkpointer::best() const {
  if (!enabled()) return "";
  try {
    return checkpoint::best(config_.dir).value_or("");
  } catch (const Error&) {
    return "";  // 'best' names no checkpoint: the caller says so
  }
}

bool Checkpointer::due(int64_t step, int64_t total_steps, bool stop_requested) const {
  return enabled() && (stop_requested || Cadence{config_.save_every}.due(step, total_steps));
}

void Checkpointer::save(const checkpoint::TrainerState& state, torch::nn::Module& model,
                        torch::optim::AdamW& optimizer, MetricsLog* metrics) {
  wait_for_save(metrics);
  const std::string step = std::to_string(state.step);
  if (!parameters_finite(world_.group(), model)) {
    log_.say("step " + step + ": weights are not finite; checkpoint not written (the latest stays the last good one)");
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto seconds_since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const int keep = static_cast<int>(config_.keep);
  if (config_.async_save) {
    if (!async_) async_ = std::make_unique<checkpoint::AsyncSaver>(world_);
    async_->save(config_.dir, keep, parts(model, optimizer), state);
    pending_step_ = state.step;
    pending_staging_seconds_ = seconds_since_start();
    return;
  }
  std::string path;
  try {
    path = checkpoint::save(config_.dir, keep, parts(model, optimizer), state, world_);
  } catch (const checkpoint::SaveError& e) {
    save_failed(e, state.step, metrics);
    return;
  }
  report_saved(path, state.step, seconds_since_start(), 0, metrics);
}

void Checkpointer::wait_for_save(MetricsLog* metrics) {
  if (!async_ || !async_->in_flight()) return;
  const int64_t step = pending_step_;
  pending_step_ = -1;
  std::optional<std::string> path;
  try {
    path = async_->wait();
  } catch (const checkpoint::SaveError& e) {
    save_failed(e, step, metrics);
    return;
  }
  report_saved(*path, step, pending_staging_seconds_, async_->last_write_seconds(), metrics);
}

void Checkpointer::save_failed(const checkpoint::SaveError& e, int64_t step, MetricsLog* metrics) {
  // Every rank has the same error, so every rank takes the same branch.
  if (config_.on_save_error == OnSaveError::kStop) {
    throw Error(std::string(e.what()) + ". Stopping (--on-save-error stop); free space and run again to resume, " +
                "or pass --on-save-error continue to train on without this checkpoint");
  }
  ++failed_saves_;
  log_.warn(std::string(e.what()) + "; training on (--on-save-error continue)");
  if (metrics) metrics->write({{"event", "checkpoint_failed"}, {"step", step}, {"error", e.what()}});
}

void Checkpointer::report_saved(const std::string& path, int64_t step, double seconds, double background_seconds,
                                MetricsLog* metrics) {
  last_saved_step_ = step;
  char line[512];
  if (config_.async_save) {
    std::snprintf(line, sizeof(line), "saved %s (%.2f s staging, %.2f s written in the background)", path.c_str(),
                  seconds, background_seconds);
  } else {
    std::snprintf(line, sizeof(line), "saved %s (%.2f s)", path.c_str(), seconds);
  }
  log_.say(line);
  if (!metrics) return;
  nlohmann::json event = {{"event", "checkpoint"}, {"step", step}, {"path", path}, {"seconds", seconds}};
  if (config_.async_save) event["background_seconds"] = background_seconds;
  metrics->write(event);
}

}  // namespace fsdp::train
