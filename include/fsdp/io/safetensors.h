#pragma once
// safetensors files (Hugging Face's weight format): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, ...,
// "__metadata__": {...}}, then the tensors' bytes. Reading memory-maps the
// file and validates the whole header up front, so a lying header (offsets
// out of the file, overlapping, sizes that do not match shapes) is an error
// naming the file and the tensor, never a crash.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdp/io/atomic_file.h"

namespace fsdp::io {

struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets within the data section
  uint64_t end = 0;
  int64_t numel = 0;  // the product of `shape`, known to fit in [begin, end)
};

class SafetensorsFile {
 public:
  // Throws fsdp::Error naming `path` and what is wrong with it.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Where an entry's bytes start in the file.
  uint64_t file_offset(const SafetensorsEntry& e) const { return data_start_ + e.begin; }

  // A tensor over the mapped bytes (valid while this object lives); reading
  // it touches only its own pages.
  at::Tensor view(const std::string& name) const;
  // The elements [begin, begin + count) of the tensor flattened, over the
  // mapped bytes like view(): the caller copies them where they go, once.
  at::Tensor read_range(const std::string& name, int64_t begin, int64_t count) const;
  // The same elements written into `out` (count = out.numel()): read
  // straight into its memory when it is contiguous and of the tensor's
  // dtype (one copy from the page cache, no page faults on the mapping),
  // else copied from read_range, converting.
  void read_range_into(const std::string& name, int64_t begin, const at::Tensor& out) const;

 private:
  const SafetensorsEntry& entry(const std::string& name) const;
  void check_inside(const SafetensorsEntry& e) const;

  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  size_t size_ = 0;
  size_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes a safetensors file one tensor at a time, so that no more than one
// tensor need be in memory: the header (names, dtypes, shapes) first, then
// each tensor's bytes in the declared order. Atomic: nothing replaces `path`
// until commit().
class SafetensorsWriter {
 public:
  struct Spec {
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(const std::string& path, const std::vector<Spec>& specs,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  // The next tensor, in declared order, with its declared dtype and shape.
  void write(const at::Tensor& tensor);
  void commit();
  uint64_t bytes_written() const { return bytes_; }
  uint32_t crc32() const { return crc_; }  // of the whole file

 private:
  void put(const void* data, size_t size);
  std::string path_;
  std::vector<Spec> specs_;
  size_t next_ = 0;
  std::unique_ptr<class AtomicFile> file_;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

// The bytes a tensor of `shape` and `dtype` occupies, or nothing where the
// product overflows 64 bits or a dimension is negative.
std::optional<uint64_t> tensor_bytes(const std::vector<int64_t>& shape, at::ScalarType dtype);

// CRC-32 (zlib's) of a whole file, streamed.
uint32_t file_crc32(const std::string& path);

// Writes contiguous copies of `tensors` in the given order, atomically.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

const char* safetensors_dtype_name(at::ScalarType dtype);
// "BF16" -> kBFloat16; throws for a name the format does not have.
at::ScalarType safetensors_dtype(const std::string& name);

}  // namespace fsdp::io
