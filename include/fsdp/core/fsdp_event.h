#pragma once
// The event log's entries (fsdp::event_log): what FSDP scheduled, in order.

#include <cstdint>
#include <string>

namespace fsdp {

// One entry of the event log: FSDP's schedule, its hooks and the points
// where it issued and waited for each collective. What a collective moved
// is the flight recorder's (distributed/flight_recorder.h), the one record of
// collectives. Compute boundaries (pre_forward, post_forward, pre_backward,
// post_backward) have equal issue and wait times.
struct FSDPEvent {
  // kUsedParameters: the end of backward's agreement on which parameters
  // got a gradient on any rank (one small all-reduce); kBroadcast: the
  // start-up broadcast of a unit's initial values.
  enum class Kind {
    kAllGather,
    kReduceScatter,
    kAllReduce,
    kPreForward,
    kPostForward,
    kPreBackward,
    kPostBackward,
    kUsedParameters,
    kBroadcast,
  };
  Kind kind;
  std::string unit;      // the unit's name from the root ("h.0"), "<root>" for the root
  int64_t sequence = 0;  // issue order, across every log of the process: compare, don't count
  double issued_s = 0;   // seconds since the log started
  double waited_s = -1;  // when its wait returned; -1 while in flight
  int ranks = 0;         // how many ranks a collective ran over; 0 for compute boundaries
};
const char* to_string(FSDPEvent::Kind kind);

}  // namespace fsdp
