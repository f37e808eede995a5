#pragma once
// `fsdp train`: a language model trained with the FSDP core on token files
// or synthetic data. Set-up is a sequence of named steps (run folder, model,
// data, mesh, FSDP, optimizer, scaler, resume, run files); Trainer::train()
// then reads top to bottom: each step trains, and the objects that own the
// "when" decisions (logging, evaluation, saving, profiling) are asked in turn.

#include <memory>
#include <optional>

#include "fsdp/core/grad_scaler.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/data/loader.h"
#include "fsdp/dist/device_mesh.h"
#include "fsdp/models/causal_lm.h"
#include "fsdp/models/hf/weights.h"
#include "fsdp/models/registry.h"
#include "fsdp/optim/fused_adamw.h"
#include "fsdp/train/config.h"
#include "fsdp/train/loss_spikes.h"
#include "fsdp/train/lr_schedule.h"
#include "fsdp/train/profile_window.h"
#include "fsdp/train/run_folder.h"
#include "fsdp/train/telemetry.h"

namespace fsdp::train {

struct TrainSummary {
  std::vector<double> train_losses;  // one per step, averaged over ranks and micro-steps
  std::vector<double> val_losses;    // one per evaluation
  std::string sample;                // generated text, if asked for
};

// "Every N steps, and at the last": when logging, evaluating and saving happen.
struct Cadence {
  int64_t every = 0;  // 0: only at the last step
  bool at_first = false;
  bool due(int64_t step, int64_t total) const {
    const bool last = step + 1 == total;
    return last || (at_first && step == 0) || (every > 0 && (step + 1) % every == 0);
  }
};

class Trainer {
 public:
  // Validates the configuration against the model, the data and the output
  // paths before any file is written or any step runs.
  Trainer(TrainConfig config, std::shared_ptr<dist::World> world);
  ~Trainer();

  TrainSummary train();

 private:
  // Where a step's time went: data loading, forward + backward (including
  // the collectives it waited on), clipping + optimizer; comm_seconds is the
  // part of the step spent blocked on collectives.
  struct StepStats {
    double loss, grad_norm, seconds, comm_seconds, data_seconds, forward_backward_seconds, optimizer_seconds;
    bool skipped = false;     // no optimizer step (non-finite, or a loss spike); every rank agrees
    std::string skip_reason;  // "not finite" or "loss spike (z = ...)"
    int64_t collectives = 0;  // FSDP's all-gathers, reduce-scatters and all-reduces (its event log)
    int64_t comm_bytes = 0;   // what this rank sent through them
    std::optional<double> aux_loss;  // the MoE load-balancing loss (scaled), mean over ranks
  };

  // Set-up, in order.
  void choose_run_folder();
  void check_output_paths() const;
  void build_model();
  void build_data();
  std::string tokenizer_dir() const;  // --tokenizer, else --init-from's, else data/gpt2
  void load_tokenizer();
  void choose_decay_groups();
  void build_mesh();
  void apply_fsdp();
  void build_optimizer();
  void build_scaler();
  void resume_if_possible();
  TrainConfig recorded_config() const;
  void warn_about_profile_window() const;
  void open_run_files();

  // The loop.
  TrainSummary run();
  StepStats train_step(int64_t step);
  bool skip_decision(double loss, double grad_norm, std::string& reason);
  void after_step(int64_t step, const StepStats& stats);
  void log_step(int64_t step, const StepStats& stats);
  void evaluate_and_log(int64_t steps_done);
  double evaluate();
  void save_checkpoint(int64_t steps_done);
  void finish_run();
  std::string sample_text();
  void export_hf();

  TrainConfig config_;
  std::shared_ptr<dist::World> world_;
  RunFolder folder_;
  bool metrics_derived_ = false;   // runtime.metrics and checkpoint.dir came from the run folder
  bool ckpt_dir_derived_ = false;
  bool print_only_ = false;  // --print-model: built and printed, nothing to train
  bool saving_ = false;  // checkpoints are written (--ckpt-dir or --save-every)
  bool resumed_ = false;
  bool finished_already_ = false;  // resumed from a checkpoint at the last step
  bool stop_requested_ = false;    // SIGTERM/SIGINT seen by some rank
  std::shared_ptr<dist::DeviceMesh> mesh_;
  models::CausalLM model_;
  std::shared_ptr<models::HfWeights> init_weights_;  // --init-from: read into shards by fully_shard
  int64_t params_ = 0;
  int64_t active_params_ = 0;  // per token: the N of 6N FLOPs (MoE: routed experts only)
  std::vector<torch::Tensor> decay_, no_decay_;
  std::unique_ptr<optim::FusedAdamW> optimizer_;
  std::unique_ptr<ShardedGradScaler> scaler_;
  std::unique_ptr<data::DataLoader> train_data_;
  std::unique_ptr<data::DataLoader> val_data_;
  std::unique_ptr<data::Tokenizer> tokenizer_;  // for samples
  std::vector<int32_t> sample_prompt_;
  LrSchedule schedule_;
  Cadence log_cadence_, eval_cadence_, save_cadence_;
  std::unique_ptr<ProfileWindow> profile_;
  LossSpikeDetector spikes_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<Progress> progress_;
  double peak_flops_ = 0;
  int64_t tokens_seen_ = 0;
  int64_t start_step_ = 0;
  int64_t last_saved_step_ = -1;
  int64_t failed_saves_ = 0;     // saves that failed under --on-save-error continue
  int64_t skipped_steps_ = 0;  // steps skipped by this process (non-finite or spikes; not restored on resume)
  int64_t bad_steps_in_a_row_ = 0;
  TrainSummary summary_;
};

}  // namespace fsdp::train
