#pragma once
// Typed reads of environment variables, with errors that name the variable.

#include <map>
#include <optional>
#include <string>

namespace fsdp {

// A snapshot of the environment, so that parsing is testable without setenv.
using EnvMap = std::map<std::string, std::string>;

EnvMap current_env();

// Returns the value, or nullopt when unset or empty.
std::optional<std::string> env_string(const EnvMap& env, const std::string& name);

// Parses a non-negative integer; throws fsdp::Error naming the variable
// (and `what`, the expectation) when the value is not one.
std::optional<long> env_int(const EnvMap& env, const std::string& name);

// Parses a string as a non-negative integer; throws naming `what` on failure.
long parse_non_negative(const std::string& text, const std::string& what);

}  // namespace fsdp
