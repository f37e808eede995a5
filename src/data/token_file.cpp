#include "fsdp/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "fsdp/common/error.h"
#include "fsdp/io/atomic_file.h"

namespace fsdp::data {
namespace {
constexpr int64_t kHeaderInts = 256;
constexpr int64_t kHeaderBytes = kHeaderInts * 4;
}  // namespace

TokenFile::TokenFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK(fd_ >= 0, "cannot open token file '", path, "': ", std::strerror(errno));
  struct stat st {};
  ::fstat(fd_, &st);
  map_size_ = static_cast<size_t>(st.st_size);
  FSDP_CHECK(static_cast<int64_t>(map_size_) >= kHeaderBytes, "'", path, "' is ", map_size_,
             " bytes, shorter than the 1024-byte header of an llm.c token file");
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd_, 0);
  FSDP_CHECK(map_ != MAP_FAILED, "cannot map '", path, "': ", std::strerror(errno));
  const auto* header = static_cast<const int32_t*>(map_);
  FSDP_CHECK(header[0] == kTokenFileMagic, "'", path, "' has magic ", header[0], ", expected ", kTokenFileMagic,
             " (an llm.c token file; `fsdp data prepare` writes them)");
  version_ = header[1];
  FSDP_CHECK(version_ == 1 || version_ == 2, "'", path, "' has version ", version_,
             ", expected 1 (uint16 tokens) or 2 (uint32 tokens)");
  count_ = header[2];
  FSDP_CHECK(count_ >= 2, "'", path, "' holds ", count_, " tokens; at least 2 are needed");
  const int64_t width = version_ == 1 ? 2 : 4;
  const int64_t available = (static_cast<int64_t>(map_size_) - kHeaderBytes) / width;
  FSDP_CHECK(available >= count_, "'", path, "' is truncated: its header promises ", count_, " tokens but the body holds ",
             available);
}

TokenFile::~TokenFile() {
  if (map_ != nullptr && map_ != MAP_FAILED) ::munmap(map_, map_size_);
  if (fd_ >= 0) ::close(fd_);
}

int64_t TokenFile::token(int64_t i) const {
  const char* body = static_cast<const char*>(map_) + kHeaderBytes;
  if (version_ == 1) return reinterpret_cast<const uint16_t*>(body)[i];
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

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens) {
  const bool narrow = std::all_of(tokens.begin(), tokens.end(), [](int32_t t) { return t >= 0 && t < 65536; });
  int32_t header[kHeaderInts] = {};
  header[0] = kTokenFileMagic;
  header[1] = narrow ? 1 : 2;
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

}  // namespace fsdp::data
