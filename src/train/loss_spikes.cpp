#include "fsdp/train/loss_spikes.h"

#include <cmath>

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

}  // namespace fsdp::train
