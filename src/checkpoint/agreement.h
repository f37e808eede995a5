#pragma once
// Collective agreement on failure: a rank that fails never leaves the
// others waiting in a later collective.

#include <vector>

#include "fsdp/distributed/process_group.h"

namespace fsdp::checkpoint::detail {

// Every rank learns which ranks failed at this point (none: empty), so a
// failure on one never leaves the others waiting in a later collective.
std::vector<int> ranks_that_failed(dist::ProcessGroup& group, bool failed_here);

}  // namespace fsdp::checkpoint::detail
