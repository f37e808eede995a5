#pragma once
// Errors of fsdp.cpp. Library code throws; only main() catches, prints one
// line ("[rank N] error: ...") and exits non-zero.

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace fsdp {

// A problem the user can fix: bad input, bad environment, a peer that failed.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

}  // namespace fsdp

// FSDP_CHECK(cond, parts...): throws fsdp::Error with the parts streamed together.
#define FSDP_CHECK(cond, ...)                                    \
  do {                                                           \
    if (!(cond)) {                                               \
      throw ::fsdp::Error(::fsdp::detail::concat(__VA_ARGS__));  \
    }                                                            \
  } while (0)

// FSDP_ASSERT(cond): an internal invariant; failing it is a bug in fsdp.cpp.
#define FSDP_ASSERT(cond)                                                          \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      throw std::logic_error(::fsdp::detail::concat(                               \
          "internal error: ", #cond, " failed at ", __FILE__, ":", __LINE__));     \
    }                                                                              \
  } while (0)
