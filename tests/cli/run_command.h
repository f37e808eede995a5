#pragma once
// Runs a shell command as a user would and captures what they would see.

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace fsdp::testing {

struct CommandResult {
  int exit_code = -1;     // the shell's status: 128+N when killed by signal N
  std::string output;     // stdout and stderr together
  double seconds = 0;     // wall-clock time
};

// `command` runs under /bin/sh with stderr merged into stdout.
CommandResult run_command(const std::string& command);

bool contains(const std::string& haystack, const std::string& needle);

// A command running in the background under /bin/sh (exec'd, so pid() is
// the program itself), its output going to `log_path`. Killed, with what it
// started, if still running when destroyed.
class BackgroundCommand {
 public:
  BackgroundCommand(const std::string& command, std::string log_path);
  ~BackgroundCommand();
  BackgroundCommand(const BackgroundCommand&) = delete;
  BackgroundCommand& operator=(const BackgroundCommand&) = delete;

  pid_t pid() const { return pid_; }
  // The program's direct children (a launcher's ranks), by pid.
  std::vector<int> children() const;
  // Waits until it has `count` children, none of them in `old`; returns
  // them (fewer if the timeout passed or the program ended).
  std::vector<int> wait_for_new_children(const std::vector<int>& old, std::chrono::seconds timeout,
                                         size_t count = 2) const;
  // Whether the program has ended (it stays unreaped for wait()).
  bool exited() const;
  // The exit status (128+N for signal N); -1 if it had to be killed at the timeout.
  int wait(std::chrono::seconds timeout);
  std::string output() const;

 private:
  pid_t pid_ = -1;
  std::string log_path_;
  bool reaped_ = false;
};

// The whole file ("" when it cannot be read).
std::string read_file(const std::string& path);

// A fresh temporary directory, removed by the caller if it cares.
std::string make_temp_dir();

}  // namespace fsdp::testing
