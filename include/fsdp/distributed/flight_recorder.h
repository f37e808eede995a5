#pragma once
// The flight recorder: the last K collectives this process issued (op,
// group, sequence number, bytes, FSDP unit, issued and completed times), so
// a hang or a desync can be explained after the fact. Light header: no
// LibTorch, so the launcher can read what its ranks recorded.
//
// [Note: flight recorder file]
// Under `fsdp launch` (FSDP_FLIGHT_RECORDER_DIR set), the ring lives in a
// memory-mapped file, rank<N>.fr in that folder: every entry is on disk the
// moment it is written, even if the rank is then killed by SIGKILL, and the
// launcher reads the files of the ranks it supervised after they stopped.
// Without the folder it lives in memory and is only printed.
//
// [Note: one account of a failure]
// A rank whose collective fails writes its dump to rank<N>.txt; it prints it
// (its last 8 entries) on stderr only when no launcher will: `fsdp launch`
// sets kLauncherReadsRecordsVar and prints, once, one line per rank of
// where each was, from the files. A rank that died of a signal the launcher
// did not send (kill -9, a crash) is described as dead, with its last
// collective, never as waiting in it.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::dist {

// Set to "1" by `fsdp launch` for its ranks: it reads their flight records
// and reports them itself (see [Note: one account of a failure]).
inline constexpr const char* kLauncherReadsRecordsVar = "FSDP_LAUNCH_READS_FLIGHT_RECORDS";

// One collective as recorded. Plain bytes: it is the file's record format.
struct FlightEntry {
  int64_t seq = 0;           // 1, 2, ...: this process's collectives in issue order
  int64_t bytes = 0;
  int64_t numel = 0;
  int64_t issued_ns = 0;     // system clock, nanoseconds since the epoch
  int64_t completed_ns = 0;  // 0 while in flight; kFailed when it failed
  int32_t group_size = 0;
  int32_t group_rank = 0;
  char op[24] = {};
  char group[24] = {};
  char role[24] = {};        // the group's part in the job, the same on every rank (see ProcessGroup::role)
  char dtype[16] = {};
  char unit[64] = {};        // the FSDP unit that issued it, or empty

  static constexpr int64_t kFailed = -1;
  bool in_flight() const { return completed_ns == 0; }
  // "all_gather_into_tensor #12 on group 'shard' (4.0 KiB, unit 'h.1')"
  std::string describe() const;
  // Whether two ranks issued the same collective: everything but times,
  // groups compared by role.
  bool same_call(const FlightEntry& other) const;
};

// Records every collective of this process. Thread-safe.
class FlightRecorder {
 public:
  // The process's recorder, sized by FSDP_FLIGHT_RECORDER (entries, default
  // 256), file-backed when FSDP_FLIGHT_RECORDER_DIR is set (rank from RANK).
  static FlightRecorder& instance();

  // Records an issued collective and returns its sequence number.
  int64_t issue(const char* op, const std::string& group, const std::string& role, int group_rank, int group_size,
                int64_t numel, int64_t bytes, const char* dtype);
  void complete(int64_t seq, bool ok);

  // A hash of every collective issued so far (op, group role, size, dtype, in
  // order), below 2^52 so a double carries it exactly. Equal on all ranks
  // exactly when they issued the same collectives (up to hash collisions).
  uint64_t fingerprint() const;
  int64_t issued() const;

  // Running totals since the process started, kept beside the ring (never
  // dropped with old entries): the collectives issued under a
  // CollectiveLabel (FSDP's units), the bytes this rank sent into them, and
  // the time spent blocked waiting for any collective (communication that
  // computation did not hide). Telemetry takes differences of these.
  struct Totals {
    int64_t labeled = 0;
    int64_t labeled_bytes = 0;
    int64_t blocked_ns = 0;
  };
  Totals totals() const;
  // Adds time blocked in a collective's wait (Work::wait, barrier).
  void add_blocked(int64_t ns);

  // The recorded entries, oldest first (at most the capacity).
  std::vector<FlightEntry> entries() const;
  // Entry `seq`, if still in the ring.
  std::optional<FlightEntry> find(int64_t seq) const;
  // The last `n` entries as lines, for an error report.
  std::string dump(size_t n) const;
  // Writes dump() of every entry to rank<N>.txt in the recorder folder, if any.
  void write_text_dump() const;
  // After collective `seq` failed: marks it failed, writes the text dump
  // and, the first time in this process and unless the launcher reports the
  // records, prints the last entries on stderr.
  void report_failure(int64_t seq);

  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

 private:
  FlightRecorder();
  struct Impl;
  Impl* impl_;
};

// Names the FSDP unit for collectives issued on this thread while alive.
class CollectiveLabel {
 public:
  explicit CollectiveLabel(const std::string& unit);
  ~CollectiveLabel();
  CollectiveLabel(const CollectiveLabel&) = delete;
  CollectiveLabel& operator=(const CollectiveLabel&) = delete;

 private:
  const std::string* previous_;
};

// What a rank recorded, read back from its file.
struct RankRecord {
  int rank = -1;
  int pid = 0;                       // the process that recorded it
  std::vector<FlightEntry> entries;  // oldest first
  // Set by the reader: the signal that killed the process when it died of
  // one nobody sent to stop it (kill -9, a crash); 0 while it runs, after it
  // exited, or when stopped on purpose.
  int killed_by_signal = 0;
  // Set by the reader: the process was stopped (SIGSTOP, Ctrl-Z, a
  // debugger) when the failure was seen, so it was not waiting: it held
  // the others. Described as stopped even when it died after being
  // continued.
  bool stopped = false;
};
// Reads rank<N>.fr from `dir`; nullopt when absent or not a recorder file.
std::optional<RankRecord> read_rank_record(const std::string& dir, int rank);
// DIR/rank<N>.txt, where write_text_dump puts rank N's dump.
std::string text_dump_path(const std::string& dir, int rank);

// One line per rank: where it waits (its oldest collective in flight) or,
// when none is, the last it completed. "rank 1 waits in all_gather_into_tensor
// #1234 on group 'shard' (..., unit 'h.3'), issued 12.1 s ago". A rank killed
// by a signal is dead, with its last recorded collective: "rank 1 is dead
// (killed by signal 9, SIGKILL); its last collective, in flight when it died:
// all_gather_into_tensor #1234 ..., issued 12.1 s ago".
std::vector<std::string> summarize_ranks(const std::vector<RankRecord>& ranks, int64_t now_ns);

int64_t system_now_ns();

}  // namespace fsdp::dist
