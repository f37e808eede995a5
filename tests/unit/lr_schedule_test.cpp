#include "fsdp/train/lr_schedule.h"

#include <cmath>

#include <gtest/gtest.h>

namespace fsdp::train {
namespace {

TEST(LrSchedule, WarmupThenCosine) {
  const LrSchedule s{1.0, 0.1, 4, 104, LrScheduleKind::kCosine};
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);                               // decay starts at its peak
  EXPECT_NEAR(s.at(54), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5)), 1e-12);  // half way: 0.55
  EXPECT_NEAR(s.at(104), 0.1, 1e-12);
  EXPECT_NEAR(s.at(500), 0.1, 1e-12);                           // stays at the floor
}

TEST(LrSchedule, LinearAndConstant) {
  const LrSchedule linear{2.0, 0.5, 0, 10, LrScheduleKind::kLinear};
  EXPECT_DOUBLE_EQ(linear.at(0), 2.0);
  EXPECT_DOUBLE_EQ(linear.at(5), 1.5);  // 2 - (2 - 1) * 0.5
  EXPECT_DOUBLE_EQ(linear.at(10), 1.0);
  const LrSchedule constant{0.3, 0.1, 2, 10, LrScheduleKind::kConstant};
  EXPECT_DOUBLE_EQ(constant.at(0), 0.15);
  EXPECT_DOUBLE_EQ(constant.at(9), 0.3);
}

}  // namespace
}  // namespace fsdp::train
