#include "fsdp/io/staged_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "fsdp/common/error.h"
#include "fsdp/io/remove_tree.h"

namespace fsdp::io {
namespace fs = std::filesystem;
namespace {

std::string host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string name = host;
  for (char& c : name) {
    if (c == '/' || c == '-') c = '_';
  }
  return name;
}

// Removes partial directories of `target` left on this host by processes
// that have ended (killed while they wrote).
void remove_abandoned(const fs::path& target) {
  const std::string prefix = "." + target.filename().string() + ".partial-" + host_name() + "-";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(target.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const long pid = std::strtol(digits.c_str(), nullptr, 10);
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::error_code ignored;
      remove_tree(entry.path().string(), ignored);
    }
  }
}

// Links (or, where links are refused, copies) `from` into `to`, directories
// with everything under them.
void link_tree(const fs::path& from, const fs::path& to) {
  if (fs::is_directory(fs::symlink_status(from))) {
    fs::create_directory(to);
    for (const auto& entry : fs::directory_iterator(from)) link_tree(entry.path(), to / entry.path().filename());
    return;
  }
  std::error_code ec;
  fs::create_hard_link(from, to, ec);
  if (ec) fs::copy(from, to, fs::copy_options::copy_symlinks);
}

}  // namespace

StagedDir::StagedDir(std::string target, std::string what) : target_(std::move(target)), what_(std::move(what)) {
  fs::path t = fs::path(target_).lexically_normal();
  if (t.filename().empty()) t = t.parent_path();  // "out/" names "out"
  const fs::path parent = t.parent_path().empty() ? fs::path(".") : t.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  FSDP_CHECK(!ec, what_, " '", target_, "': cannot create its parent directory (", ec.message(), ")");
  remove_abandoned(t.parent_path().empty() ? fs::path(".") / t : t);
  partial_ = (parent / ("." + t.filename().string() + ".partial-" + host_name() + "-" + std::to_string(::getpid())))
                 .string();
  remove_tree(partial_, ec);  // this PID's own, from an attempt before
  FSDP_CHECK(fs::create_directory(partial_, ec) && !ec, what_, " '", target_, "': cannot create '", partial_, "' (",
             ec.message(), ")");
}

StagedDir::~StagedDir() {
  if (published_) return;
  std::error_code ignored;
  remove_tree(partial_, ignored);
}

void StagedDir::publish(const std::function<bool(const std::string&)>& keep) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(target_, ec))) {
    FSDP_CHECK(::rename(partial_.c_str(), target_.c_str()) == 0, what_, " '", target_, "': cannot move '", partial_,
               "' there (", std::strerror(errno), ")");
    published_ = true;
    return;
  }
  FSDP_CHECK(fs::is_directory(fs::symlink_status(target_, ec)), what_, " '", target_,
             "' is not a directory; expected a directory (or a path to create one at)");
  for (const auto& entry : fs::directory_iterator(target_)) {
    const std::string name = entry.path().filename().string();
    if (!fs::exists(fs::symlink_status(fs::path(partial_) / name)) && keep(name)) {
      link_tree(entry.path(), fs::path(partial_) / name);
    }
  }
  if (::renameat2(AT_FDCWD, partial_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
    published_ = true;  // the earlier version now lies at the partial path
    remove_tree(partial_, ec);
    return;
  }
  FSDP_CHECK(errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP, what_, " '", target_, "': cannot exchange it with '",
             partial_, "' (", std::strerror(errno), ")");
  const std::string old = partial_ + ".old";
  FSDP_CHECK(::rename(target_.c_str(), old.c_str()) == 0, what_, " '", target_, "': cannot move it aside (",
             std::strerror(errno), ")");
  FSDP_CHECK(::rename(partial_.c_str(), target_.c_str()) == 0, what_, " '", target_, "': cannot move '", partial_,
             "' there (", std::strerror(errno), "); the earlier version is at '", old, "'");
  published_ = true;
  remove_tree(old, ec);
}

}  // namespace fsdp::io
