#include "fsdp/common/env.h"

#include <gtest/gtest.h>

#include "fsdp/common/error.h"

namespace fsdp {
namespace {

TEST(Env, EmptyCountsAsUnset) {
  EXPECT_FALSE(env_string({{"X", ""}}, "X").has_value());
  EXPECT_FALSE(env_int({}, "X").has_value());
}

TEST(Env, ParsesIntegers) {
  EXPECT_EQ(env_int({{"X", "42"}}, "X"), 42);
  EXPECT_THROW(env_int({{"X", "4x"}}, "X"), Error);
  EXPECT_THROW(env_int({{"X", "99999999999999999999"}}, "X"), Error);
}

}  // namespace
}  // namespace fsdp
