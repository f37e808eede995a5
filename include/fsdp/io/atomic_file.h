#pragma once
// Writing a file so that readers see the old version or the new one, never
// half of one: written under a temporary name, fsynced, renamed over the
// target, and the directory fsynced. A failure leaves the target untouched.
// Light header: no LibTorch.

#include <cstddef>
#include <memory>
#include <string>

namespace fsdp::io {

class AtomicFile {
 public:
  // kStreamed, for large files written once (checkpoints, exports): the
  // bytes bypass the page cache (O_DIRECT) through aligned staging buffers,
  // one written by a background thread while the next fills; where the
  // filesystem refuses O_DIRECT (tmpfs), the same as kBuffered. See
  // [Note: checkpoint writes past the page cache].
  enum class Mode { kBuffered, kStreamed };
  explicit AtomicFile(std::string path, Mode mode = Mode::kBuffered);  // throws fsdp::Error naming the path
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // without commit(): removes the temporary file

  void write(const void* data, size_t size);
  void write(const std::string& text) { write(text.data(), text.size()); }
  void commit();

 private:
  struct Streamed;
  void write_through(const void* data, size_t size);
  void check_written(int error) const;  // an errno from a streamed write, or 0

  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  bool committed_ = false;
  std::unique_ptr<Streamed> streamed_;  // set while O_DIRECT staging is in use
};

// Convenience: the whole content at once.
void write_file_atomically(const std::string& path, const std::string& content);

}  // namespace fsdp::io
