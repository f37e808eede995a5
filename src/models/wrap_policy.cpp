#include "fsdp/models/wrap_policy.h"

#include <cmath>
#include <cstdlib>

#include "fsdp/common/error.h"

namespace fsdp::models {

WrapPolicy parse_wrap_policy(const std::string& text, const std::string& flag) {
  if (text == "block") return {};
  const std::string prefix = "size:";
  if (text.rfind(prefix, 0) == 0 && text.size() > prefix.size()) {
    const std::string number = text.substr(prefix.size());
    char* end = nullptr;
    const double n = std::strtod(number.c_str(), &end);
    if (end != nullptr && *end == '\0' && n >= 1 && n < 1e15 && n == std::floor(n)) {
      return {WrapPolicy::Kind::kSize, static_cast<int64_t>(n)};
    }
  }
  throw Error(flag + " '" + text + "' is not a wrap policy (expected block, or size:N with N a positive whole number " +
              "of parameters, such as size:100000 or size:1e6)");
}

}  // namespace fsdp::models
