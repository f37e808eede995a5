#pragma once
// Fuzz input as a file, for readers that take a path: a memfd, named by its
// /proc/self/fd path, gone when the object is.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace fsdp::fuzz {

class InputFile {
 public:
  InputFile(const uint8_t* data, size_t size, const char* suffix = "") {
    fd_ = ::memfd_create("fuzz", MFD_CLOEXEC);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_) + suffix;
  }
  ~InputFile() { ::close(fd_); }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace fsdp::fuzz
