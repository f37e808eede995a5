#include "fsdp/train/step_guard.h"

#include <cmath>
#include <cstdio>

#include "fsdp/common/error.h"

namespace fsdp::train {

double LossSpikeDetector::z_score(double loss) const {
  if (static_cast<int>(history_.size()) < min_history_) return 0;
  double mean = 0;
  for (double l : history_) mean += l;
  mean /= static_cast<double>(history_.size());
  double var = 0;
  for (double l : history_) var += (l - mean) * (l - mean);
  const double sd = std::sqrt(var / static_cast<double>(history_.size()));
  return sd > 0 ? (loss - mean) / sd : 0;
}

void LossSpikeDetector::accept(double loss) {
  history_.push_back(loss);
  if (static_cast<int>(history_.size()) > window_) history_.pop_front();
}

StepVerdict StepGuard::judge(double loss, double grad_norm) const {
  if (!std::isfinite(loss) || (!loss_scaler_ && !std::isfinite(grad_norm))) return {true, true, "not finite"};
  const double z = spikes_.z_score(loss);
  if (skip_spikes_ > 0 && z > skip_spikes_) {
    char text[96];
    std::snprintf(text, sizeof(text), "loss spike (z-score %.1f > --skip-spikes %g)", z, skip_spikes_);
    return {true, false, text};
  }
  return {};
}

void StepGuard::record(double loss, const StepVerdict& verdict) {
  if (verdict.skip) ++skipped_;
  bad_in_a_row_ = verdict.non_finite ? bad_in_a_row_ + 1 : 0;
  if (!verdict.skip) spikes_.accept(loss);
}

void StepGuard::stop_if_too_many_bad(int64_t step, double loss, double grad_norm, const std::string& context) const {
  FSDP_CHECK(bad_in_a_row_ < max_bad_steps_, "step ", step + 1, ": loss ", loss, ", gradient norm ", grad_norm, ": ",
             bad_in_a_row_, " non-finite steps in a row (--max-bad-steps ", max_bad_steps_,
             "); stopping. Each was skipped, so the weights are those of the last finite step", context,
             ". Lower the learning rate, clip gradients (--grad-clip), or use bf16 instead of fp16");
}

}  // namespace fsdp::train
