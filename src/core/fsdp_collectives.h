#pragma once
// FSDP's collectives on one unit's flat buffers (FSDP2's
// _fsdp_collectives): functions that keep no state, each returning the
// record of what it left in flight. Whoever holds a record owns that
// collective: its wait, its buffers, and its cleanup after an error. One
// record per collective, so a reduce-scatter and the replica all-reduce
// after it never share a handle.

#include <memory>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include "fsdp/distributed/collectives.h"

#include "core/counted_tensor.h"
#include "core/device_streams.h"
#include "core/event_log.h"

namespace fsdp {

// A tree's event log and device streams, which every collective of its
// units is recorded in and runs on.
struct TreeComm {
  EventLog& log;
  DeviceStreams& streams;
};

// Where a unit's collective runs (its group, the tree's streams), where it
// is logged, and under what name.
struct UnitComm {
  dist::ProcessGroup& group;
  EventLog& log;
  DeviceStreams& streams;
  const std::string& unit;
  // Reductions sum instead of averaging (a gradient divide factor divides
  // the sum once: [Note: where 1/W enters] in gradient_paths.cpp).
  bool sum = false;
};

// One collective in flight, with the buffers it reads and writes.
struct PendingCollective {
  std::optional<dist::Work> work;  // none: finished already (one rank, nothing to send)
  size_t event = 0;                // its entry in the event log
  CountedTensor input{memory::BufferKind::kComm};   // freed once the collective is done
  CountedTensor output{memory::BufferKind::kComm};  // the result, for whoever takes it
  // A gather over one rank: a copy, done (CPU) or on its way (a GPU: the
  // event the stream current at wait() waits for), not yet waited; so the
  // unit does not issue it a second time before its wait.
  bool copied_only = false;
  std::shared_ptr<c10::Event> copied;

  bool in_flight() const { return work.has_value() || copied_only; }
  // Waits (under `scope` in profiles), marks the wait in the event log and
  // frees the input. With nothing in flight it only frees the input.
  void wait(EventLog& log, const char* scope);
  // After an error: waits, swallowing failures (the caller's error is the
  // one reported), and drops both buffers.
  void abandon() noexcept;
};

// `shard` gathered from every rank into `gathered` (W x its size), cast to
// gathered's dtype first. With one rank it is a copy (casting as it copies)
// and nothing is left in flight.
PendingCollective all_gather(const UnitComm& on, const at::Tensor& shard, const at::Tensor& gathered);

// `input` (W x S elements) reduce-scattered, averaging (summing with
// `on.sum`), into a fresh shard of S elements: the record's output. With
// one rank the input is the output.
PendingCollective reduce_scatter(const UnitComm& on, CountedTensor input);

// `buffer` averaged (summed with `on.sum`) across the group, in place.
PendingCollective all_reduce(const UnitComm& on, const at::Tensor& buffer);

// Byte `flags` set where any rank of the group set them (a max), in place:
// the ranks agree on which parameters got a gradient anywhere. Logged as
// kUsedParameters, apart from the gradients' all-reduces.
PendingCollective any_rank(const UnitComm& on, const at::Tensor& flags);

// `buffer` overwritten with rank 0's, in place, where the group has more
// than one rank: the start-up broadcast that makes every rank begin from
// the same initialisation. Waited for before it returns.
void broadcast_from_rank0(const UnitComm& on, const at::Tensor& buffer);

}  // namespace fsdp
