#pragma once
// Learning rate at a step: linear warmup, then cosine, linear or constant.
// Light header: no LibTorch.

#include <cstdint>
#include <string>

namespace fsdp::train {

enum class LrScheduleKind { kCosine, kLinear, kConstant };

struct LrSchedule {
  double lr = 3e-4;
  double min_lr_ratio = 0.1;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  LrScheduleKind kind = LrScheduleKind::kCosine;

  // Steps count from 0: step 0 of a 10-step warmup runs at lr / 10.
  double at(int64_t step) const;
};

}  // namespace fsdp::train
