#pragma once
// TensorBoard event files: scalars per step, and text, in TensorFlow's record format
// (length, masked CRC-32C of the length, an Event message, its masked
// CRC-32C). Light header: no LibTorch, no protobuf.

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::train {

class TensorBoardWriter {
 public:
  // Creates DIR/events.out.tfevents.<seconds>.<host>.<pid> and writes the
  // file-version event. A new file per process: TensorBoard merges the
  // files of one directory, so a resumed run continues the same curves.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();

  const std::string& path() const { return path_; }
  // One event holding every (tag, value) pair for `step`; flushed at once
  // so a crash loses nothing already logged.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // A text summary (Markdown, which TensorBoard's Text tab renders) at `step`.
  void text(int64_t step, const std::string& tag, const std::string& markdown);

 private:
  void write_record(const std::string& bytes);
  std::string path_;
  std::ofstream out_;
};

// CRC-32C as TensorFlow masks it in record headers: rotated right by 15
// bits plus 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace fsdp::train
