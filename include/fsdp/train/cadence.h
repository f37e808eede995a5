#pragma once
// When something periodic happens in a run (log lines, evaluations,
// checkpoints). Light header: no LibTorch.

#include <cstdint>

namespace fsdp::train {

// "Every N steps, and at the last": when logging, evaluating and saving happen.
struct Cadence {
  int64_t every = 0;  // 0: only at the last step
  bool at_first = false;
  bool due(int64_t step, int64_t total) const {
    const bool last = step + 1 == total;
    return last || (at_first && step == 0) || (every > 0 && (step + 1) % every == 0);
  }
};

}  // namespace fsdp::train
