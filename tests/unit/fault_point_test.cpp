// Named fault points: FSDP_FAULT_POINT sends the process the named signal
// (SIGKILL unless named; THROW throws fsdp::Error instead) on the named visit, only in the first attempt, and
// refuses a name that is no point or a signal it does not send.
// Each case runs in a child (a death test), which reads the variable afresh.

#include <signal.h>

#include <cstdio>
#include <cstdlib>

#include <gtest/gtest.h>

#include "fsdp/common/error.h"
#include "fsdp/common/fault_point.h"

namespace fsdp {
namespace {

constexpr const char* kPoint = "checkpoint.before_publish";

// Reaches kPoint `visits` times under FSDP_FAULT_POINT=`armed` in attempt
// `attempt`, saying on stderr which visit it survived; exits 0 after the
// last, 3 on fsdp::Error.
void visit(const char* armed, const char* attempt, int visits) {
  ::setenv(kFaultPointVar, armed, 1);
  ::setenv("FSDP_RESTART_ATTEMPT", attempt, 1);
  try {
    for (int i = 1; i <= visits; ++i) {
      fault_point(kPoint);
      std::fprintf(stderr, "survived visit %d\n", i);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(3);
  }
  std::exit(0);
}

TEST(FaultPoint, KillsOnTheNamedVisit) {
  EXPECT_EXIT(visit("checkpoint.before_publish@2", "0", 3), ::testing::KilledBySignal(SIGKILL),
              "survived visit 1\nfsdp: fault point checkpoint.before_publish reached");
  EXPECT_EXIT(visit("checkpoint.before_publish", "0", 3), ::testing::KilledBySignal(SIGKILL),
              "fsdp: fault point checkpoint.before_publish reached");
}

TEST(FaultPoint, SendsTheNamedSignal) {
  EXPECT_EXIT(visit("checkpoint.before_publish@2:TERM", "0", 3), ::testing::KilledBySignal(SIGTERM),
              "survived visit 1\nfsdp: fault point checkpoint.before_publish reached \\(FSDP_FAULT_POINT\\): "
              "sending this process SIGTERM");
  EXPECT_EXIT(visit("checkpoint.before_publish:INT", "0", 3), ::testing::KilledBySignal(SIGINT), "SIGINT");
  EXPECT_EXIT(visit("checkpoint.before_publish:KILL", "0", 3), ::testing::KilledBySignal(SIGKILL), "SIGKILL");
}

TEST(FaultPoint, OnlyTheFirstAttemptDies) {
  EXPECT_EXIT(visit("checkpoint.before_publish@1", "1", 3), ::testing::ExitedWithCode(0), "survived visit 3");
}

TEST(FaultPoint, UnarmedOrArmedElsewhereItPasses) {
  EXPECT_EXIT(visit("", "0", 3), ::testing::ExitedWithCode(0), "survived visit 3");
  EXPECT_EXIT(visit("checkpoint.before_publish@4", "0", 3), ::testing::ExitedWithCode(0), "survived visit 3");
}

TEST(FaultPoint, ANameThatIsNoPointOrASignalItDoesNotSendIsRefused) {
  EXPECT_EXIT(visit("checkpoint.before_publsh@2", "0", 1), ::testing::ExitedWithCode(3),
              "FSDP_FAULT_POINT names 'checkpoint.before_publsh', which is not a fault point "
              "\\(checkpoint.before_publish, train.start_folders_made, train.run_files_written, "
              "export.weights_file_written, train.host_step;");
  EXPECT_EXIT(visit("checkpoint.before_publish@0", "0", 1), ::testing::ExitedWithCode(3), "from 1");
  EXPECT_EXIT(visit("checkpoint.before_publish@1:HUP", "0", 1), ::testing::ExitedWithCode(3),
              "signal 'HUP' is none of KILL, TERM, INT, THROW");
}

// THROW in place of a signal: the point throws fsdp::Error on its visit,
// which the program reports as any failure of its own.
TEST(FaultPoint, ThrowRaisesAnErrorOnTheNamedVisit) {
  EXPECT_EXIT(visit("checkpoint.before_publish@2:THROW", "0", 3), ::testing::ExitedWithCode(3),
              "fault point checkpoint.before_publish reached \\(FSDP_FAULT_POINT\\): an "
              "injected failure");
  EXPECT_EXIT(visit("checkpoint.before_publish@2:THROW", "1", 3), ::testing::ExitedWithCode(0), "survived visit 3");
}

}  // namespace
}  // namespace fsdp
