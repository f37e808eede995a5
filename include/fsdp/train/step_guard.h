#pragma once
// Which optimizer steps are skipped, and when skipping becomes stopping.
// A step is skipped when its loss or gradient norm is not finite, or when
// its loss is a spike; too many non-finite steps in a row stop the run.
// The inputs are results of collectives, the same on every rank, so every
// rank takes the same decision. Light header: no LibTorch.

#include <cstdint>
#include <deque>
#include <string>

namespace fsdp::train {

// Loss-spike detection as llm.c does it: the z-score of a step's loss
// against the mean and standard deviation of the last `window` accepted
// losses.
class LossSpikeDetector {
 public:
  // `min_history` losses are needed before any step is judged a spike.
  explicit LossSpikeDetector(int window = 128, int min_history = 16) : window_(window), min_history_(min_history) {}
  // The loss's z-score, or 0 while the history is too short (or flat).
  double z_score(double loss) const;
  // Adds an accepted (trained-on) loss to the history.
  void accept(double loss);

 private:
  int window_, min_history_;
  std::deque<double> history_;
};

struct StepVerdict {
  bool skip = false;
  bool non_finite = false;
  std::string reason;  // "not finite" or "loss spike (z-score ...)"
};

class StepGuard {
 public:
  // `skip_spikes`: the z-score above which a step is skipped (0: never).
  // `max_bad_steps`: non-finite steps in a row that stop the run. Under a
  // loss scaler an infinite gradient is the scaler's business (it skips the
  // step and lowers the scale), so only the loss is judged.
  StepGuard(double skip_spikes, int64_t max_bad_steps, bool loss_scaler)
      : skip_spikes_(skip_spikes), max_bad_steps_(max_bad_steps), loss_scaler_(loss_scaler) {}

  StepVerdict judge(double loss, double grad_norm) const;
  // Counts the step and learns from a trained-on loss.
  void record(double loss, const StepVerdict& verdict);
  // Throws fsdp::Error when the recorded steps end in max_bad_steps
  // non-finite ones in a row (called after the step was logged); `context`
  // ends that message (what the checkpoints hold).
  void stop_if_too_many_bad(int64_t step, double loss, double grad_norm, const std::string& context) const;
  // Steps this process skipped (not restored on resume).
  int64_t skipped() const { return skipped_; }

 private:
  double skip_spikes_;
  int64_t max_bad_steps_;
  bool loss_scaler_;
  LossSpikeDetector spikes_;
  int64_t skipped_ = 0;
  int64_t bad_in_a_row_ = 0;
};

}  // namespace fsdp::train
