#include "run_command.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace fsdp::testing {

CommandResult run_command(const std::string& command) {
  CommandResult result;
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed: " + command);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) result.output.append(buf.data(), n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

BackgroundCommand::BackgroundCommand(const std::string& command, std::string log_path)
    : log_path_(std::move(log_path)) {
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::setpgid(0, 0);
    const std::string cmd = "exec " + command + " > '" + log_path_ + "' 2>&1";
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);
}

BackgroundCommand::~BackgroundCommand() {
  if (reaped_) return;
  ::kill(pid_, SIGKILL);
  for (int child : children()) ::kill(-child, SIGKILL);
  ::kill(-pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

std::vector<int> BackgroundCommand::children() const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/task/" + std::to_string(pid_) + "/children");
  std::vector<int> pids;
  for (int p; in >> p;) pids.push_back(p);
  return pids;
}

std::vector<int> BackgroundCommand::wait_for_new_children(const std::vector<int>& old, std::chrono::seconds timeout,
                                                          size_t count) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> now;
  while (std::chrono::steady_clock::now() < deadline) {
    now = children();
    const bool fresh = std::none_of(now.begin(), now.end(),
                                    [&](int p) { return std::find(old.begin(), old.end(), p) != old.end(); });
    if (now.size() == count && fresh) return now;
    if (exited()) return {};
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return now;
}

bool BackgroundCommand::exited() const {
  siginfo_t info{};
  return ::waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_;
}

int BackgroundCommand::wait(std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      reaped_ = true;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  reaped_ = true;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string BackgroundCommand::output() const { return read_file(log_path_); }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string make_temp_dir() {
  char tmpl[] = "/tmp/fsdp-test-XXXXXX";
  const char* dir = ::mkdtemp(tmpl);
  if (dir == nullptr) throw std::runtime_error("mkdtemp failed");
  return dir;
}

}  // namespace fsdp::testing
