#pragma once
// Desync detection: ranks that issue different collectives (another order,
// another group, another size, one skipped) are stopped with an error that
// names the collective, its sequence number and which ranks disagree,
// instead of hanging until the timeout.
//
// [Note: desync checks]
// Always on (unless FSDP_DEBUG=off): every rank hashes the collectives it
// issues (FlightRecorder::fingerprint) and the step's last all-reduce, which
// the trainer does anyway, carries the hash and its negation under MAX. The
// two come back as each other's negation only when every rank's hash is
// equal; otherwise the ranks exchange their flight records and report the
// first collective they disagree on. This catches every desync whose
// collectives completed (the sizes happened to match, or they went to
// different groups); one that makes the backend hang or fail is explained by
// the flight recorder instead.
// FSDP_DEBUG=detail adds a check before every collective: the ranks compare
// what they are about to issue over a group of their own, so a desync is
// reported before it can hang or corrupt anything. It assumes, as FSDP and
// HSDP do, that every rank issues the same sequence of collectives (each on
// its own group of the same name).

#include <cstdint>
#include <memory>

#include "fsdp/distributed/process_group.h"

namespace fsdp::dist {

enum class DebugLevel { kOff, kInfo, kDetail };
// FSDP_DEBUG: "off", "info" (the default) or "detail"; read once.
DebugLevel debug_level();
inline bool detail_checks_enabled() { return debug_level() == DebugLevel::kDetail; }

// The group the detail checks run on (all ranks); set by World::init.
void set_desync_check_group(std::shared_ptr<ProcessGroup> group);

// Under FSDP_DEBUG=detail: blocks until every rank is about to issue its
// collective number `seq`, and throws fsdp::Error if they differ.
void check_same_collective_everywhere(int64_t seq);

// The step's closing agreement over `world`: returns whether any rank set
// `local_flag`, and throws fsdp::Error naming the first collective on which
// the ranks' histories differ (see [Note: desync checks]). `where` says when
// the check ran ("at the end of step 12").
bool any_rank_and_check_sync(ProcessGroup& world, bool local_flag, const std::string& where);

}  // namespace fsdp::dist
