// See ../README.md: declarations only, for c10d's ProcessGroupGloo.hpp.
#pragma once
#include <chrono>

namespace gloo {

// ProcessGroupGloo::setTimeout (inline in c10d's header) calls this.
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};

}  // namespace gloo
