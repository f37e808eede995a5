#include "fsdp/io/streamed_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <vector>

#include "fsdp/common/error.h"

namespace fsdp::io {

// [Note: checkpoint reads at the disk's pace]
// A load used to checksum each rank file in one pass (1 MiB reads through
// the page cache) and then copy its ranges out of a memory map: two passes,
// and the first one stalled the disk whenever it computed. Measured on the
// development VM (2-core AMD EPYC, GPT-2 small with AdamW, 1.49 GB over 2
// ranks): the checksum pass alone took 0.7 to 1.0 s against dd's 0.58 s
// for both files. Here one pass does both: background reads of 8 MiB
// blocks, with O_DIRECT where the filesystem allows it (no copy through
// the page cache), three queued ahead so the disk always has work (one at
// a time left it idle: dd with iflag=direct took 1.0 to 1.25 s on the same
// files, against 0.65 s through the cache with its readahead), into a
// ring of aligned buffers, while the caller checksums the oldest and
// copies from it the bytes it needs. The checksum is known only at the
// end, so the caller keeps what it copied out of use until it matches.
namespace {

constexpr size_t kAlign = 4096;
constexpr size_t kBlock = size_t{8} << 20;
constexpr size_t kInFlight = 3;  // reads queued ahead of the block being looked at

struct AlignedBuffer {
  char* data = nullptr;
  AlignedBuffer() {
    void* p = nullptr;
    FSDP_CHECK(::posix_memalign(&p, kAlign, kBlock) == 0, "cannot allocate an aligned read buffer");
    data = static_cast<char*>(p);
  }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
};

// Reads up to `size` bytes at `at`; returns the count read, or -errno.
ssize_t read_block(int fd, char* p, size_t size, off_t at) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, p + done, size - done, at + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

}  // namespace

uint32_t read_streamed(const std::string& path,
                       const std::function<void(uint64_t offset, const char* data, size_t size)>& on_block) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  bool direct = fd >= 0;
  if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { ::close(*f); });
  struct stat st {};
  FSDP_CHECK(::fstat(fd, &st) == 0, "cannot stat '", path, "': ", std::strerror(errno));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (!direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);

  const size_t depth = kInFlight;
  std::vector<std::unique_ptr<AlignedBuffer>> buffers;
  for (size_t i = 0; i < depth + 1; ++i) buffers.push_back(std::make_unique<AlignedBuffer>());
  const auto expected = [&](uint64_t block) { return std::min<uint64_t>(kBlock, size - block * kBlock); };
  const uint64_t blocks = (size + kBlock - 1) / kBlock;
  std::deque<std::future<ssize_t>> reads;  // blocks [done, done + reads.size()) in flight, in order
  uint64_t issued = 0;
  const auto issue_more = [&] {
    while (reads.size() < depth && issued < blocks) {
      reads.push_back(std::async(std::launch::async, [fd, data = buffers[issued % buffers.size()]->data, block = issued] {
        return read_block(fd, data, kBlock, static_cast<off_t>(block * kBlock));
      }));
      ++issued;
    }
  };
  uLong crc = ::crc32(0L, Z_NULL, 0);
  issue_more();
  for (uint64_t block = 0; block < blocks; ++block) {
    ssize_t n = reads.front().get();
    reads.pop_front();
    if (n == -EINVAL && direct && block == 0) {
      // The filesystem took O_DIRECT at open but refuses its reads (tmpfs):
      // the reads in flight fail alike; start over, buffered.
      for (auto& r : reads) r.wait();
      reads.clear();
      const int buffered = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      FSDP_CHECK(buffered >= 0, "cannot open '", path, "': ", std::strerror(errno));
      ::close(fd);
      fd = buffered;
      direct = false;
      n = read_block(fd, buffers[0]->data, kBlock, 0);
      issued = 1;
    }
    FSDP_CHECK(n >= 0, "cannot read '", path, "': ", std::strerror(static_cast<int>(-n)));
    FSDP_CHECK(static_cast<uint64_t>(n) == expected(block), "'", path, "' ended after ", block * kBlock + n,
               " of its ", size, " bytes (changed while being read)");
    issue_more();
    const char* data = buffers[block % buffers.size()]->data;
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(data), static_cast<uInt>(n));
    if (on_block) on_block(block * kBlock, data, static_cast<size_t>(n));
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace fsdp::io
