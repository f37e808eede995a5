#pragma once
// The log of one module tree's FSDP collectives and compute boundaries, in
// issue order: every collective issued and waited, and every unit's hooks,
// for tests (was unit i+1 gathered before unit i finished?) and telemetry.
// A leaf: the collectives, the gradient paths and the tree record into it,
// and it knows none of them.

#include <chrono>
#include <cstddef>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "fsdp/core/fsdp_event.h"

namespace fsdp {

class EventLog {
 public:
  // Bounded to the last kMaxEvents entries.
  static constexpr size_t kMaxEvents = 8192;

  EventLog();
  size_t record(FSDPEvent::Kind kind, const std::string& unit, int ranks = 0);
  void mark_waited(size_t sequence);
  std::vector<FSDPEvent> events() const { return {events_.begin(), events_.end()}; }
  void clear() { events_.clear(); }
  // The root of an earlier tree joins this log's: the events its tree
  // logged (its start-up broadcasts above all) join this log in issue
  // order, each unit's under the name it has from here (`new_names`, by
  // the name it had there). Sequence numbers are the process's, so an
  // event still in flight is marked waited where it now lies.
  void adopt(const EventLog& other, const std::unordered_map<std::string, std::string>& new_names);

 private:
  double now_s() const;

  std::deque<FSDPEvent> events_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace fsdp
