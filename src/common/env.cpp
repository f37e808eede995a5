#include "fsdp/common/env.h"

#include <cerrno>
#include <cstdlib>

#include "fsdp/common/error.h"

extern char** environ;

namespace fsdp {

EnvMap current_env() {
  EnvMap env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string kv(*entry);
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

std::optional<std::string> env_string(const EnvMap& env, const std::string& name) {
  const auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

long parse_non_negative(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  FSDP_CHECK(!text.empty() && end == text.c_str() + text.size() && errno == 0 && value >= 0,
             what, " is '", text, "': expected a non-negative integer");
  return value;
}

std::optional<long> env_int(const EnvMap& env, const std::string& name) {
  const auto text = env_string(env, name);
  if (!text) return std::nullopt;
  return parse_non_negative(*text, "environment variable " + name);
}

}  // namespace fsdp
