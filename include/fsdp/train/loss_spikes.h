#pragma once
// Loss-spike detection as llm.c does it: the z-score of a step's loss
// against the mean and standard deviation of the last `window` accepted
// losses. Light header: no LibTorch.

#include <cstdint>
#include <deque>

namespace fsdp::train {

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

}  // namespace fsdp::train
