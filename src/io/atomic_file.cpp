#include "fsdp/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fsdp/common/error.h"

namespace fsdp::io {
namespace {

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  tmp_path_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  FSDP_CHECK(fd_ >= 0, "cannot write '", path_, "': ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    FSDP_CHECK(n > 0, "writing '", path_, "' failed: ", std::strerror(errno), " (the previous file is untouched)");
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  FSDP_CHECK(::fsync(fd_) == 0, "writing '", path_, "' failed at fsync: ", std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  FSDP_CHECK(::rename(tmp_path_.c_str(), path_.c_str()) == 0, "cannot rename '", tmp_path_, "' to '", path_,
             "': ", std::strerror(errno));
  committed_ = true;
  // The rename itself must survive a crash.
  const int dir = ::open(parent_dir(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void write_file_atomically(const std::string& path, const std::string& content) {
  AtomicFile file(path);
  file.write(content);
  file.commit();
}

}  // namespace fsdp::io
