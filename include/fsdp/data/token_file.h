#pragma once
// llm.c token files: 256 little-endian int32 header ([0] magic, [1]
// version, [2] token count), then the tokens. As llm.c's writer
// (dev/data/data_common.py) makes them: GPT-2 files are magic 20240520,
// version 1, uint16 tokens; Llama-3 files are magic 20240801, version 7,
// uint32 tokens. Files from fsdp.cpp before it followed llm.c's wide header
// (20240520, version 2, uint32) are still read. Light header: no LibTorch.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::data {

constexpr int32_t kTokenFileMagic = 20240520;      // uint16 tokens, version 1
constexpr int32_t kWideTokenFileMagic = 20240801;  // uint32 tokens, version 7

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
  int width_ = 2;  // bytes per token
  int64_t count_ = 0;
};

// Writes llm.c's GPT-2 header and uint16 tokens when the vocabulary's ids
// fit in 16 bits (vocab_size <= 65536), else its Llama-3 header and uint32
// tokens; atomically. vocab_size 0: decided by the largest id.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size = 0);

// Several token files read as one stream, in the order given: the
// data-order contract's positions run across them.
class TokenStream {
 public:
  explicit TokenStream(const std::vector<std::string>& paths);
  int64_t size() const { return total_; }
  // n tokens from `start`, wrapping at the end of the stream.
  void read(int64_t start, int64_t n, int64_t* out) const;
  // The largest token id, the file that holds it and where in that file.
  struct MaxToken {
    int64_t id;
    std::string path;
    int64_t position;
  };
  MaxToken max_token() const;
  size_t files() const { return files_.size(); }

 private:
  std::vector<std::unique_ptr<TokenFile>> files_;
  std::vector<int64_t> starts_;  // stream position of each file's first token
  int64_t total_ = 0;
};

// The token files `spec` names: one path, a glob ("data/train_*.bin",
// sorted), or a comma-separated list of either. Throws naming `flag` for a
// directory, a glob that matches nothing or a missing file.
std::vector<std::string> expand_token_paths(const std::string& spec, const std::string& flag);

}  // namespace fsdp::data
