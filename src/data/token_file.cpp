#include "fsdp/data/token_file.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "fsdp/common/error.h"
#include "fsdp/io/atomic_file.h"
#include "fsdp/io/input_file.h"

namespace fsdp::data {
namespace {
constexpr int64_t kHeaderInts = 256;
constexpr int64_t kHeaderBytes = kHeaderInts * 4;
}  // namespace

TokenFile::TokenFile(const std::string& path) : path_(path) {
  fd_ = io::open_regular_file(path, "token file");
  struct stat st {};
  ::fstat(fd_, &st);
  map_size_ = static_cast<size_t>(st.st_size);
  FSDP_CHECK(static_cast<int64_t>(map_size_) >= kHeaderBytes, "'", path, "' is ", map_size_,
             " bytes, shorter than the 1024-byte header of an llm.c token file");
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd_, 0);
  FSDP_CHECK(map_ != MAP_FAILED, "cannot map '", path, "': ", std::strerror(errno));
  const auto* header = static_cast<const int32_t*>(map_);
  FSDP_CHECK(header[0] == kTokenFileMagic || header[0] == kWideTokenFileMagic, "'", path, "' has magic ", header[0],
             ", expected ", kTokenFileMagic, " (llm.c, GPT-2 tokens) or ", kWideTokenFileMagic,
             " (llm.c, Llama-3 tokens); `fsdp data prepare` writes them");
  version_ = header[1];
  if (header[0] == kWideTokenFileMagic) {
    FSDP_CHECK(version_ == 7, "'", path, "' has magic ", kWideTokenFileMagic, " and version ", version_,
               ", expected version 7 (uint32 tokens)");
  } else {
    FSDP_CHECK(version_ == 1 || version_ == 2, "'", path, "' has magic ", kTokenFileMagic, " and version ", version_,
               ", expected version 1 (uint16 tokens)");
  }
  count_ = header[2];
  FSDP_CHECK(count_ >= 2, "'", path, "' holds ", count_, " tokens; at least 2 are needed");
  width_ = version_ == 1 ? 2 : 4;
  const int64_t width = width_;
  const int64_t available = (static_cast<int64_t>(map_size_) - kHeaderBytes) / width;
  FSDP_CHECK(available >= count_, "'", path, "' is truncated: its header promises ", count_,
             " tokens but the body holds ", available);
  // llm.c's writer puts nothing after the tokens: more bytes mean a body of
  // another width (4-byte ids under a 2-byte header) or a damaged file.
  const int64_t extra = static_cast<int64_t>(map_size_) - kHeaderBytes - count_ * width;
  FSDP_CHECK(extra == 0, "'", path, "' holds ", extra, " bytes after the ", count_, " tokens of ", width,
             " bytes its header promises (magic ", header[0], ", version ", version_,
             "): a body of another width, or a damaged file");
}

TokenFile::~TokenFile() {
  if (map_ != nullptr && map_ != MAP_FAILED) ::munmap(map_, map_size_);
  if (fd_ >= 0) ::close(fd_);
}

int64_t TokenFile::token(int64_t i) const {
  const char* body = static_cast<const char*>(map_) + kHeaderBytes;
  if (width_ == 2) return reinterpret_cast<const uint16_t*>(body)[i];
  return reinterpret_cast<const uint32_t*>(body)[i];
}

void TokenFile::read(int64_t start, int64_t n, int64_t* out) const {
  int64_t pos = start % count_;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = token(pos);
    if (++pos == count_) pos = 0;
  }
}

std::pair<int64_t, int64_t> TokenFile::max_token() const {
  int64_t best = -1, where = 0;
  for (int64_t i = 0; i < count_; ++i) {
    const int64_t t = token(i);
    if (t > best) {
      best = t;
      where = i;
    }
  }
  return {best, where};
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size) {
  if (vocab_size == 0) {
    vocab_size = 1;
    for (int32_t t : tokens) vocab_size = std::max<int64_t>(vocab_size, int64_t{t} + 1);
  }
  const bool narrow = vocab_size <= 65536;
  FSDP_CHECK(tokens.size() < (size_t{1} << 31), "'", path, "': ", tokens.size(),
             " tokens do not fit one llm.c token file (fewer than 2^31); split it into shards");
  int32_t header[kHeaderInts] = {};
  header[0] = narrow ? kTokenFileMagic : kWideTokenFileMagic;
  header[1] = narrow ? 1 : 7;
  header[2] = static_cast<int32_t>(tokens.size());
  io::AtomicFile file(path);
  file.write(header, sizeof(header));
  if (narrow) {
    std::vector<uint16_t> body(tokens.begin(), tokens.end());
    file.write(body.data(), body.size() * 2);
  } else {
    file.write(tokens.data(), tokens.size() * 4);
  }
  file.commit();
}

TokenStream::TokenStream(const std::vector<std::string>& paths) {
  FSDP_CHECK(!paths.empty(), "no token files given");
  for (const auto& p : paths) {
    files_.push_back(std::make_unique<TokenFile>(p));
    starts_.push_back(total_);
    total_ += files_.back()->size();
  }
}

void TokenStream::read(int64_t start, int64_t n, int64_t* out) const {
  int64_t pos = start % total_;
  size_t f = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin()) - 1;
  while (n > 0) {
    const int64_t in_file = pos - starts_[f];
    const int64_t take = std::min(n, files_[f]->size() - in_file);
    files_[f]->read(in_file, take, out);
    out += take;
    n -= take;
    pos += take;
    if (++f == files_.size()) {
      f = 0;
      pos = 0;
    }
    if (take == 0) break;
  }
}

TokenStream::MaxToken TokenStream::max_token() const {
  MaxToken best{-1, "", 0};
  for (const auto& f : files_) {
    const auto [id, where] = f->max_token();
    if (id > best.id) best = {id, f->path(), where};
  }
  return best;
}

std::vector<std::string> expand_token_paths(const std::string& spec, const std::string& flag) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= spec.size()) {
    const size_t comma = std::min(spec.find(',', begin), spec.size());
    const std::string item = spec.substr(begin, comma - begin);
    begin = comma + 1;
    if (item.empty()) continue;
    struct stat st {};
    if (item.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      const int rc = ::glob(item.c_str(), 0, nullptr, &g);
      FSDP_CHECK(rc == 0 && g.gl_pathc > 0, flag, " '", item, "' matches no file");
      for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
      ::globfree(&g);
    } else {
      FSDP_CHECK(
          ::stat(item.c_str(), &st) == 0, flag, " '", item,
          "': no such file (expected an llm.c token file, a glob such as 'train_*.bin', or a comma-separated list)");
      FSDP_CHECK(!S_ISDIR(st.st_mode), flag, " '", item, "' is a directory; expected token files (try '", item,
                 "/train_*.bin' or '", item, "/train.bin')");
      out.push_back(item);
    }
  }
  FSDP_CHECK(!out.empty(), flag, " names no token file");
  return out;
}

}  // namespace fsdp::data
