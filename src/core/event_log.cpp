#include "core/event_log.h"

#include <algorithm>
#include <atomic>

namespace fsdp {

const char* to_string(FSDPEvent::Kind kind) {
  switch (kind) {
    case FSDPEvent::Kind::kAllGather: return "all_gather";
    case FSDPEvent::Kind::kReduceScatter: return "reduce_scatter";
    case FSDPEvent::Kind::kAllReduce: return "all_reduce";
    case FSDPEvent::Kind::kPreForward: return "pre_forward";
    case FSDPEvent::Kind::kPostForward: return "post_forward";
    case FSDPEvent::Kind::kPreBackward: return "pre_backward";
    case FSDPEvent::Kind::kPostBackward: return "post_backward";
    case FSDPEvent::Kind::kUsedParameters: return "used_parameters";
    case FSDPEvent::Kind::kBroadcast: return "broadcast";
  }
  return "?";
}

EventLog::EventLog() : start_(std::chrono::steady_clock::now()) {}

double EventLog::now_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

namespace {
// Issue order across every log of the process: a tree's log may adopt
// another's without renumbering either.
std::atomic<int64_t> next_event_sequence{0};
}  // namespace

size_t EventLog::record(FSDPEvent::Kind kind, const std::string& unit, int ranks) {
  const bool collective = kind == FSDPEvent::Kind::kAllGather || kind == FSDPEvent::Kind::kReduceScatter ||
                          kind == FSDPEvent::Kind::kAllReduce || kind == FSDPEvent::Kind::kUsedParameters ||
                          kind == FSDPEvent::Kind::kBroadcast;
  FSDPEvent e{kind, unit, next_event_sequence++, now_s(), -1, ranks};
  if (!collective) e.waited_s = e.issued_s;
  if (events_.size() == kMaxEvents) events_.pop_front();
  events_.push_back(std::move(e));
  return static_cast<size_t>(events_.back().sequence);
}

void EventLog::adopt(const EventLog& other, const std::unordered_map<std::string, std::string>& new_names) {
  const double shift = std::chrono::duration<double>(other.start_ - start_).count();
  std::vector<FSDPEvent> merged(events_.begin(), events_.end());
  for (FSDPEvent e : other.events_) {
    const auto renamed = new_names.find(e.unit);
    if (renamed != new_names.end()) e.unit = renamed->second;
    e.issued_s += shift;
    if (e.waited_s >= 0) e.waited_s += shift;
    merged.push_back(std::move(e));
  }
  std::sort(merged.begin(), merged.end(), [](const FSDPEvent& a, const FSDPEvent& b) { return a.sequence < b.sequence; });
  if (merged.size() > kMaxEvents) merged.erase(merged.begin(), merged.end() - kMaxEvents);
  events_.assign(merged.begin(), merged.end());
}

void EventLog::mark_waited(size_t sequence) {
  // The log is in issue order; an entry dropped from its front is not found.
  const auto target = static_cast<int64_t>(sequence);
  const auto it = std::lower_bound(events_.begin(), events_.end(), target,
                                   [](const FSDPEvent& e, int64_t s) { return e.sequence < s; });
  if (it != events_.end() && it->sequence == target) it->waited_s = now_s();
}

}  // namespace fsdp
