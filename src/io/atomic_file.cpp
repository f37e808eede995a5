#include "fsdp/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>

#include "fsdp/common/error.h"

namespace fsdp::io {

// [Note: checkpoint writes past the page cache]
// A rank file of a checkpoint is written once and read back, if ever, by a
// later run. Through the page cache, write() copies every byte into dirty
// pages that the kernel then throttles the writer on and flushes at
// fsync; measured on the development VM, that held a rank's save to about
// 430 MB/s against the disk's 0.78 s for the same 1.49 GB with
// `dd oflag=direct`. kStreamed opens the file O_DIRECT and stages bytes
// into two 8 MiB buffers aligned to 4 KiB: while one is written (a
// background thread, pwrite at aligned offsets), the caller fills the
// other, so the copy and the checksum the caller computes overlap the disk.
// The tail is padded to the alignment and the file truncated back to its
// size. A filesystem that refuses O_DIRECT (tmpfs, at open or at the first
// write) gets plain buffered writes of the same bytes.
struct AtomicFile::Streamed {
  static constexpr size_t kAlign = 4096;
  static constexpr size_t kBuffer = size_t{8} << 20;

  struct Buffer {
    char* data = nullptr;
    Buffer() {
      void* p = nullptr;
      FSDP_CHECK(::posix_memalign(&p, kAlign, kBuffer) == 0, "cannot allocate an aligned write buffer");
      data = static_cast<char*>(p);
    }
    ~Buffer() { std::free(data); }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
  };

  Buffer buffers[2];
  int current = 0;
  size_t fill = 0;            // bytes staged in buffers[current]
  off_t offset = 0;           // where buffers[current] goes in the file
  std::future<int> pending;   // the other buffer's write: 0, or the errno it failed with

  // Writes `size` bytes (a multiple of kAlign) at `at`; returns 0 or errno.
  static int write_all(int fd, const char* p, size_t size, off_t at) {
    while (size > 0) {
      const ssize_t n = ::pwrite(fd, p, size, at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return n < 0 ? errno : EIO;
      p += n;
      at += n;
      size -= static_cast<size_t>(n);
    }
    return 0;
  }
  int wait() {
    if (!pending.valid()) return 0;
    return pending.get();
  }
};

namespace {

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

AtomicFile::AtomicFile(std::string path, Mode mode) : path_(std::move(path)) {
  tmp_path_ = path_ + ".tmp." + std::to_string(::getpid());
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  if (mode == Mode::kStreamed) {
    fd_ = ::open(tmp_path_.c_str(), flags | O_DIRECT, 0644);
    if (fd_ >= 0) {
      // Some filesystems take the flag at open and refuse the writes: one
      // aligned block (overwritten later, or truncated away) tells.
      streamed_ = std::make_unique<Streamed>();
      std::memset(streamed_->buffers[0].data, 0, Streamed::kAlign);
      if (Streamed::write_all(fd_, streamed_->buffers[0].data, Streamed::kAlign, 0) != 0) {
        streamed_.reset();
        ::close(fd_);
        fd_ = -1;
      }
    }
  }
  if (fd_ < 0) fd_ = ::open(tmp_path_.c_str(), flags, 0644);
  FSDP_CHECK(fd_ >= 0, "cannot write '", path_, "': ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (streamed_) streamed_->wait();  // the thread writes into fd_
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t size) {
  if (!streamed_) {
    write_through(data, size);
    return;
  }
  Streamed& s = *streamed_;
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const size_t n = std::min(size, Streamed::kBuffer - s.fill);
    std::memcpy(s.buffers[s.current].data + s.fill, p, n);
    s.fill += n;
    p += n;
    size -= n;
    if (s.fill < Streamed::kBuffer) break;
    // Full: hand it to the writer once the other one is written.
    check_written(s.wait());
    s.pending = std::async(std::launch::async, [fd = fd_, buffer = s.buffers[s.current].data, at = s.offset] {
      return Streamed::write_all(fd, buffer, Streamed::kBuffer, at);
    });
    s.offset += static_cast<off_t>(Streamed::kBuffer);
    s.current ^= 1;
    s.fill = 0;
  }
}

void AtomicFile::check_written(int error) const {
  FSDP_CHECK(error == 0, "writing '", path_, "' failed: ", std::strerror(error), " (the previous file is untouched)");
}

void AtomicFile::write_through(const void* data, size_t size) {
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
  if (streamed_) {
    Streamed& s = *streamed_;
    check_written(s.wait());
    // The tail, padded to the alignment, then cut back to the file's size.
    const size_t padded = (s.fill + Streamed::kAlign - 1) / Streamed::kAlign * Streamed::kAlign;
    std::memset(s.buffers[s.current].data + s.fill, 0, padded - s.fill);
    check_written(Streamed::write_all(fd_, s.buffers[s.current].data, padded, s.offset));
    FSDP_CHECK(::ftruncate(fd_, s.offset + static_cast<off_t>(s.fill)) == 0, "writing '", path_,
               "' failed at truncate: ", std::strerror(errno));
  }
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
