#include "fsdp/io/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fsdp/common/error.h"

namespace fsdp::io {
namespace {

std::string this_process() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return std::string("host ") + host + ", PID " + std::to_string(::getpid()) + ", since " + stamp;
}

}  // namespace

DirLock::DirLock(const std::string& dir, const std::string& what, const std::string& flag)
    : dir_(dir), path_(dir + "/" + kFileName) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  FSDP_CHECK(fd_ >= 0, what, " '", dir, "': cannot open its lock file '", path_, "' (", std::strerror(errno), ")");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int saved = errno;
    ::close(fd_);
    fd_ = -1;
    FSDP_CHECK(saved == EWOULDBLOCK, what, " '", dir, "': cannot lock '", path_, "' (", std::strerror(saved), ")");
    const std::string who = holder(dir);
    throw Error(what + " '" + dir + "' is in use by another job (" + (who.empty() ? "its holder is starting" : who) +
                "); two jobs in one folder would overwrite each other's logs and checkpoints. Wait for it to end, " +
                "stop it, or choose another " + flag);
  }
  const std::string me = this_process() + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    // The lock holds without its note; a second job's message says less.
  }
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

void DirLock::release_and_remove() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());
  ::close(fd_);
  fd_ = -1;
}

FileLock::FileLock(const std::string& path, const std::string& flag) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  FSDP_CHECK(fd_ >= 0, flag, " '", path, "': cannot open it (", std::strerror(errno),
             errno == ELOOP ? "; it is a symbolic link, and a run writes its files only as files of its own" : "", ")");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int saved = errno;
    ::close(fd_);
    fd_ = -1;
    FSDP_CHECK(saved == EWOULDBLOCK, flag, " '", path, "': cannot lock it (", std::strerror(saved), ")");
    throw Error(flag + " '" + path + "' is being written by another live job; two jobs appending to one file " +
                "would write over each other's lines. Choose another " + flag + ", or wait for that job to end");
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

std::string DirLock::holder(const std::string& dir) {
  std::ifstream in(dir + "/" + kFileName);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string folder_of_a_live_job(const std::string& path, const std::vector<std::string>& own) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> mine;
  for (const auto& dir : own) mine.push_back(fs::weakly_canonical(dir, ec));
  for (fs::path p = fs::weakly_canonical(path, ec); !p.empty(); p = p.parent_path()) {
    if (std::find(mine.begin(), mine.end(), p) == mine.end()) {
      const int fd = ::open((p / DirLock::kFileName).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      if (fd >= 0) {
        // A shared lock is refused only while a job holds the exclusive one.
        const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
        ::close(fd);
        if (held) return p.string();
      }
    }
    if (p == p.parent_path()) break;
  }
  return "";
}

void refuse_a_live_jobs_folder(const std::string& path, const std::string& flag, const std::vector<std::string>& own) {
  if (path.empty()) return;
  const std::string live = folder_of_a_live_job(path, own);
  if (live.empty()) return;
  const std::string who = DirLock::holder(live);
  throw Error(flag + " '" + path + "' lies in '" + live + "', the folder of another live job (" +
              (who.empty() ? "its holder is starting" : who) +
              "); this would write among that job's files. Choose a path outside it");
}

}  // namespace fsdp::io
