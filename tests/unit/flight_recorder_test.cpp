// The flight recorder's file: a ring of the last K collectives that another
// process (the launcher) reads back, and the one-line-per-rank summary, in
// which a rank killed by a signal is dead rather than waiting.

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include <gtest/gtest.h>

#include "fsdp/distributed/flight_recorder.h"

namespace fsdp::dist {
namespace {

TEST(FlightRecorder, TheFileKeepsTheLastKAndTheSummarySaysWhereTheRankWaits) {
  char tmpl[] = "/tmp/fsdp-fr-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  // The recorder reads its settings once, at first use: this test is its only user here.
  ::setenv("FSDP_FLIGHT_RECORDER_DIR", dir.c_str(), 1);
  ::setenv("FSDP_FLIGHT_RECORDER", "4", 1);
  ::setenv("RANK", "3", 1);
  auto& recorder = FlightRecorder::instance();
  const std::string unit = "transformer.h.2";
  int64_t seq = 0;
  for (int i = 1; i <= 6; ++i) {
    std::optional<CollectiveLabel> label;
    if (i == 5) label.emplace(unit);
    seq = recorder.issue(i == 5 ? "all_gather_into_tensor" : "all_reduce", "shard", "shard", 0, 2, 1024 * i, 4096 * i,
                         "Float");
    EXPECT_EQ(seq, i);
    if (i != 5) recorder.complete(seq, true);
  }
  const auto record = read_rank_record(dir, 3);
  ASSERT_TRUE(record.has_value());
  ASSERT_EQ(record->entries.size(), 4u);  // 3..6: the ring holds four
  EXPECT_EQ(record->entries.front().seq, 3);
  EXPECT_EQ(record->entries.back().seq, 6);
  EXPECT_STREQ(record->entries[2].unit, "transformer.h.2");
  EXPECT_TRUE(record->entries[2].in_flight());

  const auto issued = record->entries[2].issued_ns;
  const auto lines = summarize_ranks({*record, RankRecord{4, {}}}, issued + 2'500'000'000);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "rank 3 waits in all_gather_into_tensor #5 on group 'shard' (5120 Float, 20.0 KiB, unit "
                      "'transformer.h.2'), issued 2.5 s ago");
  EXPECT_EQ(lines[1], "rank 4 issued no collective");
  EXPECT_FALSE(read_rank_record(dir, 7).has_value());
  std::filesystem::remove_all(dir);
}

FlightEntry entry(int64_t seq, const char* op, int64_t issued_ns, int64_t completed_ns) {
  FlightEntry e;
  e.seq = seq;
  e.numel = 256;
  e.bytes = 1024;
  e.issued_ns = issued_ns;
  e.completed_ns = completed_ns;
  e.group_size = 2;
  std::snprintf(e.op, sizeof(e.op), "%s", op);
  std::snprintf(e.group, sizeof(e.group), "world");
  std::snprintf(e.role, sizeof(e.role), "world");
  std::snprintf(e.dtype, sizeof(e.dtype), "Float");
  return e;
}

TEST(FlightRecorder, ARankKilledBySignalIsDeadWithItsLastCollectiveNotWaiting) {
  const int64_t s = 1'000'000'000;
  const FlightEntry done = entry(7, "all_reduce", 1 * s, 2 * s);
  const FlightEntry pending = entry(8, "all_gather_into_tensor", 3 * s, 0);
  RankRecord in_flight{1, 0, {done, pending}, 9};
  RankRecord completed{2, 0, {done}, 9};
  RankRecord silent{3, 0, {}, 6};
  RankRecord stopped{4, 0, {done, pending}, 0};  // stopped on purpose: it was waiting
  const auto lines = summarize_ranks({in_flight, completed, silent, stopped}, 5 * s + s / 2);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "rank 1 is dead (killed by signal 9, SIGKILL); its last collective, in flight when it died: "
                      "all_gather_into_tensor #8 on group 'world' (256 Float, 1.0 KiB), issued 2.5 s ago");
  EXPECT_EQ(lines[1], "rank 2 is dead (killed by signal 9, SIGKILL); its last collective: all_reduce #7 on group "
                      "'world' (256 Float, 1.0 KiB), completed 3.5 s ago");
  EXPECT_EQ(lines[2], "rank 3 is dead (killed by signal 6, SIGABRT) and issued no collective");
  EXPECT_EQ(lines[3],
            "rank 4 waits in all_gather_into_tensor #8 on group 'world' (256 Float, 1.0 KiB), issued 2.5 s ago");
}

TEST(FlightRecorder, ARankSeenStoppedIsNamedStoppedEvenWhenItDiedOnceContinued) {
  // The launcher continues a stopped rank to stop it; with its peers gone it
  // may die of SIGPIPE before the summary is written. The stop was the cause.
  const int64_t s = 1'000'000'000;
  const FlightEntry failed = entry(28, "all_reduce", 1 * s, FlightEntry::kFailed);
  RankRecord stopped_then_killed{1, 0, {failed}, 13};
  stopped_then_killed.stopped = true;
  const auto lines = summarize_ranks({stopped_then_killed}, 5 * s);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "rank 1 was stopped (SIGSTOP, Ctrl-Z or a debugger) while the others waited for it "
                      "(then killed by signal 13, SIGPIPE); its last collective, which failed: all_reduce #28 on "
                      "group 'world' (256 Float, 1.0 KiB), issued 4.0 s ago");
}

}  // namespace
}  // namespace fsdp::dist
