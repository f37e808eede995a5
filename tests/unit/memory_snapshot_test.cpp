// The allocation log's counts and recordings, the pickle writer's bytes and
// the snapshot's layout, against hand-computed values.

#include <gtest/gtest.h>

#include "fsdp/common/allocation_log.h"
#include "fsdp/io/memory_snapshot.h"
#include "fsdp/io/pickle_writer.h"

namespace fsdp {
namespace {

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

TEST(PickleWriter, WritesProtocolTwoOpcodesByHand) {
  io::PickleWriter w;
  w.begin_dict();
  w.value("a");
  w.begin_list();
  w.value(int64_t{7});
  w.value(int64_t{300});
  w.value(int64_t{-2});
  w.value(int64_t{1} << 40);
  w.value(true);
  w.end_list();
  w.end_dict();
  // PROTO 2, EMPTY_DICT MARK, BINUNICODE "a", EMPTY_LIST MARK, BININT1 7,
  // BININT2 300, BININT -2, LONG1 8 bytes 2^40, NEWTRUE, APPENDS, SETITEMS, STOP.
  const std::string expected =
      bytes({0x80, 2,    '}',  '(',  'X',  1, 0, 0, 0, 'a', ']', '(', 'K', 7, 'M',  0x2c, 1,   'J',
             0xfe, 0xff, 0xff, 0xff, 0x8a, 8, 0, 0, 0, 0,   0,   1,   0,   0, 0x88, 'e',  'u', '.'});
  EXPECT_EQ(w.finish(), expected);
}

TEST(PickleWriter, FloatsAreBigEndianDoubles) {
  io::PickleWriter w;
  w.value(1.0);
  EXPECT_EQ(w.finish(), bytes({0x80, 2, 'G', 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, '.'}));
}

// Long lists go out 1000 items per APPENDS, as CPython's pickler writes
// them: ints 0..2000 (opcodes K and M, whose bytes never form "e(") make
// two full batches and one of a single item.
TEST(PickleWriter, AppendsLongListsInBatchesOfAThousand) {
  io::PickleWriter w;
  w.begin_list();
  for (int64_t i = 0; i <= 2000; ++i) w.value(i);
  w.end_list();
  const std::string p = w.finish();
  size_t batches = 0;
  for (size_t at = p.find("e("); at != std::string::npos; at = p.find("e(", at + 1)) ++batches;
  EXPECT_EQ(batches, 2u);
  EXPECT_EQ(p.substr(p.size() - 5), bytes({'M', 0xd0, 0x07, 'e'}) + ".");
  EXPECT_EQ(p.size(), 2 + 2 + 256 * 2 + 1745 * 3 + 2 * 2 + 1 + 1);
}

// The log is process-wide: each test uses addresses of its own and
// measures differences.
TEST(AllocationLog, CountsBytesAndThePeakAndIgnoresUnknownFrees) {
  const int64_t before = memory::allocated_bytes();
  memory::reset_allocated_peak();
  int a = 0, b = 0;
  memory::on_allocate(&a, 1000);
  memory::on_allocate(&b, 500);
  EXPECT_EQ(memory::allocated_bytes() - before, 1500);
  memory::on_free(&a);
  memory::on_free(&a);  // twice: the second is unknown, ignored
  int unknown = 0;
  memory::on_free(&unknown);
  EXPECT_EQ(memory::allocated_bytes() - before, 500);
  EXPECT_EQ(memory::peak_allocated_bytes() - before, 1500);
  memory::on_free(&b);
  EXPECT_EQ(memory::allocated_bytes(), before);
}

TEST(AllocationLog, ARecordingHoldsEventsPhasesThePeakAndTheLiveBlocks) {
  int held_before = 0, x = 0, y = 0;
  memory::on_allocate(&held_before, 64);
  const int64_t start = memory::allocated_bytes();
  memory::start_recording();
  memory::set_phase("forward h.0");
  memory::on_allocate(&x, 100);
  memory::set_phase("backward h.0");
  memory::on_allocate(&y, 40);
  memory::on_free(&x);
  memory::on_free(&held_before);
  const memory::Recording r = memory::stop_recording();
  memory::on_free(&y);
  EXPECT_EQ(r.bytes_at_start, start);
  EXPECT_EQ(r.peak_bytes, start + 140);
  ASSERT_EQ(r.events.size(), 4u);
  EXPECT_EQ(r.peak_event, 1);
  EXPECT_EQ(r.events[0].size, 100);
  EXPECT_EQ(r.events[2].size, -100);
  EXPECT_EQ(r.events[3].size, -64);
  EXPECT_EQ(r.phases[static_cast<size_t>(r.events[0].phase)], "forward h.0");
  EXPECT_EQ(r.phases[static_cast<size_t>(r.events[1].phase)], "backward h.0");
  bool found = false;
  for (const auto& block : r.live_at_end) {
    if (block.addr == reinterpret_cast<uint64_t>(&y)) {
      found = true;
      EXPECT_EQ(block.size, 40);
      EXPECT_EQ(r.phases[static_cast<size_t>(block.phase)], "backward h.0");
    }
    EXPECT_NE(block.addr, reinterpret_cast<uint64_t>(&x));
  }
  EXPECT_TRUE(found);
}

TEST(MemorySnapshot, HasTheKeysPyTorchsViewerReads) {
  memory::Recording r;
  r.phases = {"before recording", "optimizer"};
  r.events = {{5, 4096, 256, 1}, {9, 4096, -256, 1}};
  r.live_at_end = {{8192, 128, 0}};
  r.bytes_at_start = 128;
  r.peak_bytes = 384;
  r.peak_event = 0;
  const std::string p = memory::memory_snapshot_pickle(r, 3);
  for (const char* key : {"segments", "device_traces", "blocks", "active_allocated", "alloc", "free_completed",
                          "time_us", "frames", "optimizer", "total_size"}) {
    EXPECT_NE(p.find(key), std::string::npos) << key;
  }
  EXPECT_EQ(p.substr(0, 2), bytes({0x80, 2}));
  EXPECT_EQ(p.back(), '.');
}

}  // namespace
}  // namespace fsdp
