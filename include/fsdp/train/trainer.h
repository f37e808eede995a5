#pragma once
// `fsdp train`: a language model trained with the FSDP core on token files
// or synthetic data. Trainer::train() reads top to bottom: set up, loop
// over steps (micro-steps, clip, step, log, evaluate), sample, export.

#include <memory>
#include <optional>

#include "fsdp/core/grad_scaler.h"
#include "fsdp/data/gpt2_tokenizer.h"
#include "fsdp/data/loader.h"
#include "fsdp/dist/device_mesh.h"
#include "fsdp/models/causal_lm.h"
#include "fsdp/models/registry.h"
#include "fsdp/train/config.h"
#include "fsdp/train/lr_schedule.h"
#include "fsdp/train/telemetry.h"

namespace fsdp::train {

struct TrainSummary {
  std::vector<double> train_losses;  // one per step, averaged over ranks and micro-steps
  std::vector<double> val_losses;    // one per evaluation
  std::string sample;                // generated text, if asked for
};

class Trainer {
 public:
  // Validates the configuration against the model and the data before any
  // file is written or any collective runs.
  Trainer(TrainConfig config, std::shared_ptr<dist::World> world);
  ~Trainer();

  TrainSummary train();

 private:
  // Where a step's time went: data loading, forward + backward (including
  // the collectives it waited on), clipping + optimizer; comm_seconds is the
  // part of the step spent blocked on collectives.
  struct StepStats {
    double loss, grad_norm, seconds, comm_seconds, data_seconds, forward_backward_seconds, optimizer_seconds;
    bool skipped = false;     // non-finite loss or gradient norm: no optimizer step (every rank agrees)
    int64_t collectives = 0;  // FSDP's all-gathers, reduce-scatters and all-reduces (its event log)
    int64_t comm_bytes = 0;   // what this rank sent through them
  };
  void resume_if_possible();
  void save_checkpoint(int64_t steps_done);
  void build_model();
  void build_optimizer();
  StepStats train_step(int64_t step);
  double evaluate();
  void log_step(int64_t step, const StepStats& stats);
  std::string sample_text();
  void export_hf();

  TrainConfig config_;
  std::shared_ptr<dist::World> world_;
  std::shared_ptr<dist::DeviceMesh> mesh_;
  models::CausalLM model_;
  std::shared_ptr<models::HfWeights> init_weights_;  // --init-from: read into shards by fully_shard
  int64_t params_ = 0;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<ShardedGradScaler> scaler_;
  std::unique_ptr<data::DataLoader> train_data_;
  std::unique_ptr<data::DataLoader> val_data_;
  std::unique_ptr<data::GPT2Tokenizer> tokenizer_;  // for samples
  LrSchedule schedule_;
  std::unique_ptr<MetricsFile> metrics_;
  std::unique_ptr<Progress> progress_;
  double peak_flops_ = 0;
  int64_t tokens_seen_ = 0;
  int64_t start_step_ = 0;
  int64_t skipped_steps_ = 0;     // non-finite steps skipped in this run
  int64_t bad_steps_in_a_row_ = 0;
  TrainSummary summary_;
};

}  // namespace fsdp::train
