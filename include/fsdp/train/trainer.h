#pragma once
// `fsdp train`: a language model trained with the FSDP core on token files
// or synthetic data. Set-up is a sequence of named steps (run folder, model,
// data, mesh, FSDP, optimizer, scaler, resume, run files); Trainer::train()
// then reads top to bottom: each step trains, and the objects that own the
// "when" decisions (logging, evaluation, saving, profiling) are asked in turn.

#include <limits>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "fsdp/core/grad_scaler.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/data/loader.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/models/causal_lm.h"
#include "fsdp/optim/fused_adamw.h"
#include "fsdp/train/cadence.h"
#include "fsdp/train/checkpointer.h"
#include "fsdp/train/config.h"
#include "fsdp/train/host_step.h"
#include "fsdp/train/lr_schedule.h"
#include "fsdp/train/preference.h"
#include "fsdp/train/profile_window.h"
#include "fsdp/train/run_folder.h"
#include "fsdp/train/run_folder_claim.h"
#include "fsdp/train/step_guard.h"
#include "fsdp/train/telemetry.h"

namespace fsdp::train {

struct TrainSummary {
  std::vector<double> train_losses;  // one per step, averaged over ranks and micro-steps
  std::vector<double> val_losses;    // one per evaluation
  std::string sample;                // generated text, if asked for
  // SIGINT or SIGTERM when the run stopped on request before its last step
  // (its checkpoint saved); 0 when it ran to the end. `fsdp train` then
  // exits 128 + the signal, as shells and torchrun do.
  int stopped_by_signal = 0;
};

class Trainer {
 public:
  // Validates the configuration against the model, the data and the output
  // paths before any file is written or any step runs. A start that fails
  // leaves no run folder behind that it created.
  Trainer(TrainConfig config, std::shared_ptr<dist::World> world);
  ~Trainer();

  TrainSummary train();

 private:
  // Whether the layout can be saved (--shard-placement columns cannot).
  bool checkpointable() const { return config_.fsdp.shard_placement != ShardPlacement::kColumns; }
  // Where a step's time went: data loading, forward + backward (including
  // the collectives it waited on), clipping + optimizer; comm_seconds is the
  // part of the step spent blocked on collectives.
  struct StepStats {
    double loss, grad_norm, seconds, comm_seconds, data_seconds, forward_backward_seconds, optimizer_seconds;
    StepVerdict verdict;      // skipped or not; every rank agrees
    int64_t collectives = 0;  // FSDP's all-gathers, reduce-scatters and all-reduces (the flight recorder's labeled ones)
    int64_t comm_bytes = 0;   // what this rank sent through them
    std::optional<double> aux_loss;  // the MoE load-balancing loss (scaled), mean over ranks
    // Input tokens of the step that are data, every rank's: what tok/s
    // counts. Padding (chat data one example a row, or a packed row's
    // tail) is not.
    int64_t real_tokens = 0;
    int64_t trained_tokens = 0;  // targets the loss covered, every rank's
    std::optional<PreferenceStats> preference;  // --objective dpo: the step's pairs, every rank's
  };
  // A micro-batch's language-model loss, and the loss it trains on (with
  // the MoE load-balancing term).
  struct Losses {
    torch::Tensor lm, trained;
  };

  // Set-up, in order.
  void set_up();
  void choose_run_folder();
  std::string tokenizer_dir() const;  // --tokenizer, else --init-from's, else data/gpt2
  void load_tokenizer();
  void resume_if_possible();
  void warn_about_profile_window();
  void write_memory_snapshot(int64_t step);
  // Whether the step just taken read the last row of an epoch of the
  // training data (--eval-every-epoch).
  bool ended_an_epoch() const;
  void open_run_files();

  // The loop.
  TrainSummary run();
  StepStats train_step(int64_t step);
  Losses loss_of(const data::Batch& batch);
  bool dpo() const { return config_.objective.name == ObjectiveKind::kDpo; }
  // --objective dpo: a batch's pairs scored by the policy (with its
  // gradient when grad mode is on) against the reference, the model as the
  // run started, scored without gradients: the frozen copy; under LoRA,
  // the model with its adapters off (fresh adapters change nothing) or
  // with the adapters --lora-init-from started from.
  PreferenceTerms preference_terms_of(const data::Batch& batch);
  // --objective dpo without LoRA: the frozen starting model, sharded as the
  // policy is (set_up builds it after the policy).
  void build_reference_model();
  torch::Tensor lm_loss(const torch::Tensor& hidden, const torch::Tensor& targets) const;
  int64_t tokens_per_step() const;
  void after_step(int64_t step, const StepStats& stats);
  void log_step(int64_t step, const StepStats& stats);
  double evaluate_and_log(int64_t steps_done);
  // --eval-samples: the first validation prompts completed greedily, said
  // in the log and sent to TensorBoard's Text tab; returned for metrics.jsonl.
  nlohmann::json validation_samples(int64_t steps_done);
  // After an evaluation during the run: VAL as the best (when `improved`)
  // or one more evaluation without a lower loss (--patience's count).
  void note_validation_loss(int64_t steps_done, double val, bool improved);
  // --keep-best at the end of a run: the best checkpoint's weights back
  // into the model, when they are not the last step's.
  void restore_best();
  double evaluate();
  // `new_best_val`: this step's validation loss sets a new best (--keep-best).
  checkpoint::TrainerState state_to_save(int64_t steps_done, std::optional<double> new_best_val = std::nullopt) const;
  void finish_run();
  std::string sample_text();
  void export_hf();

  TrainConfig config_;
  std::shared_ptr<dist::World> world_;
  RunLog log_;
  RunPaths paths_;  // the run folder, and which paths were derived from it
  // Rank 0's: the locks of the run folder and --ckpt-dir, and during set-up
  // the undoing of what the start made ([Note: one job owns a run folder]).
  std::unique_ptr<RunFolderClaim> claim_;
  bool resumed_ = false;
  // The metrics file of the run resumed (its configuration's --metrics, or
  // its run folder's); empty when unknown.
  std::string resumed_metrics_;
  bool stop_requested_ = false;    // SIGTERM/SIGINT seen by some rank
  bool stopped_early_ = false;     // --patience ran out
  bool restored_best_ = false;     // the weights in hand are the best checkpoint's (--keep-best)
  int64_t last_step_ = 0;          // the step the run ends after: runtime.steps, or where it stopped early
  // The lowest validation loss of the run's evaluations (step 0's aside),
  // its step, and the evaluations since; kept in checkpoints (TrainerState.extra).
  double best_val_ = std::numeric_limits<double>::infinity();
  int64_t best_step_ = 0;
  int64_t evals_since_best_ = 0;
  std::shared_ptr<dist::DeviceMesh> mesh_;
  models::CausalLM model_;
  models::CausalLM reference_{nullptr};  // --objective dpo without LoRA
  // --objective dpo with --lora-init-from: each adapter parameter (its
  // shard) and its starting value; the reference is the model with these.
  std::vector<std::pair<torch::Tensor, torch::Tensor>> starting_adapters_;
  // LoRA: what the frozen base is (path, weight files' sizes and CRC-32),
  // kept in each checkpoint ([Note: a LoRA checkpoint holds the adapters]).
  nlohmann::json lora_base_;
  PreferenceStats preference_stats_;     // the pairs of the step being taken
  PreferenceStats eval_preference_;      // the pairs of the last evaluation
  int64_t params_ = 0;
  int64_t active_params_ = 0;  // per token: the N of 6N FLOPs (MoE: routed experts only)
  std::unique_ptr<optim::FusedAdamW> optimizer_;
  // The optimizer's update under offload, its failures agreed on by every
  // rank ([Note: the host step overlapped with backward]).
  void host_step(double clip);
  std::unique_ptr<ShardedGradScaler> scaler_;
  // --overlap-host-step: the units' updates during backward (after the
  // model and the optimizer it uses, so destroyed before them).
  std::unique_ptr<OverlappedHostStep> host_step_;
  std::unique_ptr<data::DataLoader> train_data_;
  std::unique_ptr<data::DataLoader> val_data_;
  std::unique_ptr<data::Tokenizer> tokenizer_;  // for samples
  std::vector<int32_t> sample_prompt_;
  LrSchedule schedule_;
  Cadence log_cadence_, eval_cadence_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<StepGuard> guard_;
  std::unique_ptr<ProfileWindow> profile_;
  std::unique_ptr<MetricsLog> metrics_;  // rank 0's
  double peak_flops_ = 0;
  int64_t tokens_seen_ = 0;
  int64_t start_step_ = 0;
  TrainSummary summary_;
};

}  // namespace fsdp::train
