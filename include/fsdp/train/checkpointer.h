#pragma once
// The trainer's save and resume: where checkpoints go and when they are
// written, what a failed save does, the finite-weights guard, and what a
// resume restores and reports (the configuration keys that changed, beside
// the ones a resume may change).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "fsdp/checkpoint/async_save.h"
#include "fsdp/checkpoint/metadata.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/train/cadence.h"
#include "fsdp/train/config.h"
#include "fsdp/train/telemetry.h"

namespace fsdp::train {

// A step's checkpoint directory name under the checkpoint directory ("step_00000120").
std::string step_dir_name(int64_t step);

class Checkpointer {
 public:
  // `config.dir` empty: nothing is saved or resumed. `config` is the run's
  // own section (redirect() changes it), and outlives the checkpointer.
  Checkpointer(TrainConfig::Checkpoint& config, dist::World& world, RunLog& log);

  bool enabled() const { return !config_.dir.empty(); }
  const std::string& dir() const { return config_.dir; }

  // Collective. Loads `latest` (or --resume-from's step) into the sharded
  // model and optimizer when the directory holds one, and reports how
  // `now` differs from the configuration it was saved with. A checkpoint
  // that cannot be loaded is an error naming the checkpoints still intact.
  // After --resume-from N, newer checkpoints (of the run being redone) are
  // renamed superseded-step_M, out of `latest`'s and pruning's way.
  std::optional<checkpoint::TrainerState> resume(torch::nn::Module& model, torch::optim::AdamW& optimizer,
                                                 const TrainConfig& now);

  // Every --save-every steps, at the last step, and when the run is asked to stop.
  bool due(int64_t step, int64_t total_steps, bool stop_requested) const;

  // Collective. Writes `state` unless some rank's weights are not finite
  // (then `latest` stays the last good one). A failed save stops the run or,
  // under --on-save-error continue, is counted and reported. `metrics` is
  // rank 0's (null elsewhere). Under --async-save the state is staged and
  // written in the background, after waiting for the save before.
  void save(const checkpoint::TrainerState& state, torch::nn::Module& model, torch::optim::AdamW& optimizer,
            MetricsLog* metrics);
  // Collective. Waits for a save written in the background, and reports it
  // (or its failure, as save() does). Nothing to do without --async-save.
  void wait_for_save(MetricsLog* metrics);
  // Checkpoints hold the trainable parameters alone (a LoRA run's adapters
  // and their optimizer state; the frozen base is rebuilt from its files).
  void leave_out_frozen(bool on) { leave_out_frozen_ = on; }
  // The model and optimizer as this run saves and loads them.
  checkpoint::Parts parts(torch::nn::Module& model, torch::optim::Optimizer& optimizer) const;
  // Later saves go to `dir` (the run folder's, when a run ends without one).
  void redirect(const std::string& dir) { config_.dir = dir; }

  int64_t last_saved_step() const { return last_saved_step_; }
  // Collective. Marks the checkpoint of `step` (saved by this run, waited
  // for) as DIR/best, which pruning keeps.
  void mark_best(int64_t step, MetricsLog* metrics);
  // The checkpoint DIR/best names, or "".
  std::string best() const;
  // Collective. A resumed run's record names `step` as its best: where
  // DIR/best does not name that step's checkpoint and it is there (a run
  // stopped between the save that set the best and its mark), marks it.
  // Says so; returns whether DIR/best now names it.
  bool repair_best(int64_t step);
  int64_t failed_saves() const { return failed_saves_; }

  // Whether a "key: old -> new" difference is one a resume is expected to
  // make: where the run writes, how long it runs, how it checkpoints.
  static bool may_differ(const std::string& difference);

 private:
  std::string chosen_checkpoint() const;  // "" when there is none to resume
  std::string intact_checkpoints(const std::string& except) const;
  void set_aside_newer_than(int64_t step) const;
  void report_differences(const checkpoint::TrainerState& state, const std::string& path, const TrainConfig& now);
  // A failed save: stops the run, or is counted and reported.
  void save_failed(const checkpoint::SaveError& e, int64_t step, MetricsLog* metrics);
  void report_saved(const std::string& path, int64_t step, double seconds, double background_seconds,
                    MetricsLog* metrics);

  TrainConfig::Checkpoint& config_;
  dist::World& world_;
  RunLog& log_;
  bool leave_out_frozen_ = false;
  int64_t last_saved_step_ = -1;
  int64_t failed_saves_ = 0;
  std::unique_ptr<checkpoint::AsyncSaver> async_;  // made at the first --async-save save
  int64_t pending_step_ = -1;                      // the save in flight
  double pending_staging_seconds_ = 0;
};

}  // namespace fsdp::train
