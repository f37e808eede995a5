#pragma once
// The names of the ATen operators a piece of code dispatches on this
// thread (operators only, not named ranges): for tests that show a fused
// path skips the operators it replaces.

#include <ATen/record_function.h>

#include <functional>
#include <set>
#include <string>

namespace fsdp::testing {

inline std::set<std::string> dispatched_operators(const std::function<void()>& run) {
  static thread_local std::set<std::string> seen;
  seen.clear();
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        if (fn.scope() == at::RecordScope::FUNCTION) seen.insert(fn.name());
        return nullptr;
      }));
  run();
  at::removeCallback(handle);
  return seen;
}

}  // namespace fsdp::testing
