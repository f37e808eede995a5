#include "fsdp/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace fsdp::train {

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == LrScheduleKind::kConstant) return lr;
  const double min_lr = lr * min_lr_ratio;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps));
  if (kind == LrScheduleKind::kLinear) return lr - (lr - min_lr) * progress;
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace fsdp::train
