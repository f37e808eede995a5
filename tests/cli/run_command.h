#pragma once
// Runs a shell command as a user would and captures what they would see.

#include <string>

namespace fsdp::testing {

struct CommandResult {
  int exit_code = -1;     // the shell's status: 128+N when killed by signal N
  std::string output;     // stdout and stderr together
  double seconds = 0;     // wall-clock time
};

// `command` runs under /bin/sh with stderr merged into stdout.
CommandResult run_command(const std::string& command);

bool contains(const std::string& haystack, const std::string& needle);

// A fresh temporary directory, removed by the caller if it cares.
std::string make_temp_dir();

}  // namespace fsdp::testing
