#pragma once
// llm.c token files: 256 little-endian int32 header ([0] = 20240520 magic,
// [1] = 1 for uint16 tokens or 2 for uint32, [2] = token count), then the
// tokens. nanoGPT/llm.c data scripts write them; so does `fsdp data prepare`.
// Light header: no LibTorch.

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::data {

constexpr int32_t kTokenFileMagic = 20240520;

class TokenFile {
 public:
  // Memory-maps and validates the header against the file size. Throws
  // fsdp::Error naming the file: missing, bad magic, unknown version,
  // truncated body.
  explicit TokenFile(const std::string& path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }
  int64_t token(int64_t i) const;
  // n tokens from `start`, wrapping at the end of the file.
  void read(int64_t start, int64_t n, int64_t* out) const;
  // The largest token id, and where it first appears.
  std::pair<int64_t, int64_t> max_token() const;

 private:
  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  int version_ = 1;
  int64_t count_ = 0;
};

// Writes tokens as uint16 when every id fits, else uint32; atomically.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens);

}  // namespace fsdp::data
