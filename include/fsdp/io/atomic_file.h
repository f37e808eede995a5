#pragma once
// Writing a file so that readers see the old version or the new one, never
// half of one: written under a temporary name, fsynced, renamed over the
// target, and the directory fsynced. A failure leaves the target untouched.
// Light header: no LibTorch.

#include <cstddef>
#include <string>

namespace fsdp::io {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // throws fsdp::Error naming the path
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // without commit(): removes the temporary file

  void write(const void* data, size_t size);
  void write(const std::string& text) { write(text.data(), text.size()); }
  void commit();

 private:
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// Convenience: the whole content at once.
void write_file_atomically(const std::string& path, const std::string& content);

}  // namespace fsdp::io
