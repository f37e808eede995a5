#pragma once
// The world shared by the multi-rank tests. Each test binary runs on every
// rank under `fsdp launch`; GoogleTest runs the tests in the same order on
// all ranks, so their collectives match.

#include <memory>

#include "fsdp/distributed/process_group.h"

namespace fsdp::testing {

dist::World& test_world();
std::shared_ptr<dist::World> test_world_ptr();

}  // namespace fsdp::testing
