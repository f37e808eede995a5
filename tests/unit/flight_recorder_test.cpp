// The flight recorder's file: a ring of the last K collectives that another
// process (the launcher) reads back, and the one-line-per-rank summary.

#include <cstdlib>
#include <filesystem>
#include <optional>

#include <gtest/gtest.h>

#include "fsdp/dist/flight_recorder.h"

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

}  // namespace
}  // namespace fsdp::dist
