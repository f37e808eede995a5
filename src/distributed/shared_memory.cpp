#include "distributed/shared_memory.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace fsdp::dist {

// [Note: shared-memory collectives]
// Gloo moves a CPU group's collectives over TCP, even between processes on
// one host: on loopback a 16 KB all-gather takes about a millisecond and a
// 4 MB one runs at about 1 GB/s, so a model of many small units spends its
// step in the kernel's socket path. When every member of a group can map
// the same /dev/shm segment, the group's collectives go through it instead:
//
// - The segment holds two buffers per member of `round_bytes` each. A
//   collective moves in rounds: each member copies its part into its buffer,
//   then reads the others' (a gather copies, a reduction sums in rank order,
//   in fp32 for half types, as the Gloo path does). Round k uses buffer
//   k % 2, so a member may write round k while another still reads k - 1.
// - Members publish "written round k" and "read round k" counters and wait
//   on each other's by spinning briefly, then sleeping on a futex rung at
//   every publication.
// - One thread per group runs the collectives in the order the group issued
//   them, as Gloo's threads do, so issuing never blocks and a collective
//   progresses while the caller computes; the caller's wait blocks on its
//   completion, with the group's timeout.
// - Every round carries a description of its collective (operation, bytes,
//   type, reduction, root) beside the member's counter, and each member
//   compares the others' with its own before reading: ranks that issue
//   different collectives fail at once, naming both, where TCP would mix
//   or hang.
// - Each member holds a lock on its own byte of the segment (an open file
//   description lock); the kernel drops it when the process exits, so a
//   waiting member finds a dead peer within a tenth of a second and fails
//   naming it, rather than at the timeout.
// - The segment is created by the group's rank 0 with a random name and
//   token, checked by every member, and unlinked as soon as all have mapped
//   it (or connecting fails): only a rank 0 killed inside connect() can
//   leave one in /dev/shm. Where any member cannot or will not map it
//   (another host, a container with its own /dev/shm, no room,
//   FSDP_SHARED_MEMORY=0 on that rank), every member keeps Gloo.
// - Collectives that the transport does not carry (reductions of bool or
//   int8, say) go to Gloo on the same group; the transport's barrier does
//   not wait for them, so callers wait on their handles first.

namespace {

constexpr int64_t kLine = 64;
constexpr int64_t kPage = 4096;
constexpr int kSpins = 256;
constexpr int kSleepMs = 20;
constexpr int kLivenessEveryMs = 100;

int64_t align_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// Header: the token, then the doorbell and sleeper count on lines of their
// own, then each member's written and read counters, one line each; the
// written line also holds the description of the member's last two rounds
// (by parity, as the buffers are).
constexpr int64_t kTokenOffset = 0;
constexpr int64_t kDoorbellOffset = kLine;
constexpr int64_t kSleepersOffset = 2 * kLine;
constexpr int64_t kCountersOffset = 4 * kLine;

constexpr int64_t kDescriptionOffset = 8;  // within a written line: two of {bytes, what}

int64_t data_offset(int size) { return align_up(kCountersOffset + 2 * size * kLine, kPage); }
int64_t segment_bytes(int size, int64_t round_bytes) { return data_offset(size) + 2 * size * round_bytes; }

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int ms) {
  timespec ts{ms / 1000, static_cast<long>(ms % 1000) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Counters wrap after 2^32 rounds; differences stay meaningful.
bool reached(uint32_t count, uint32_t target) { return static_cast<int32_t>(count - target) >= 0; }

std::string errno_text(int err) { return std::strerror(err); }

// Open file description locks: held by this mapping's descriptor, not by
// the process, so nothing else the process opens or closes drops them.
bool lock_byte(int fd, int byte, int cmd, short type, struct flock* out = nullptr) {
  struct flock fl {};
  fl.l_pid = 0;
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  const bool ok = fcntl(fd, cmd, &fl) == 0;
  if (out != nullptr) *out = fl;
  return ok;
}

template <typename T, typename Acc>
void reduce_chunk(char* out_bytes, const char* const* sources, int members, int64_t n, ReduceOp op) {
  constexpr int64_t kTile = 1024;
  Acc acc[kTile];
  T* out = reinterpret_cast<T*>(out_bytes);
  for (int64_t base = 0; base < n; base += kTile) {
    const int64_t m = std::min(kTile, n - base);
    const T* first = reinterpret_cast<const T*>(sources[0]) + base;
    for (int64_t i = 0; i < m; ++i) acc[i] = static_cast<Acc>(first[i]);
    for (int j = 1; j < members; ++j) {
      const T* s = reinterpret_cast<const T*>(sources[j]) + base;
      if (op == ReduceOp::kMax) {
        for (int64_t i = 0; i < m; ++i) {
          const Acc v = static_cast<Acc>(s[i]);
          if (v > acc[i] || v != v) acc[i] = v;  // NaN wins, as in a max over ranks
        }
      } else {
        for (int64_t i = 0; i < m; ++i) acc[i] += static_cast<Acc>(s[i]);
      }
    }
    if (op == ReduceOp::kAvg) {
      for (int64_t i = 0; i < m; ++i) acc[i] /= static_cast<Acc>(members);
    }
    for (int64_t i = 0; i < m; ++i) out[base + i] = static_cast<T>(acc[i]);
  }
}

void reduce(at::ScalarType type, char* out, const char* const* sources, int members, int64_t n, ReduceOp op) {
  switch (type) {
    case at::kFloat: return reduce_chunk<float, float>(out, sources, members, n, op);
    case at::kDouble: return reduce_chunk<double, double>(out, sources, members, n, op);
    case at::kBFloat16: return reduce_chunk<c10::BFloat16, float>(out, sources, members, n, op);
    case at::kHalf: return reduce_chunk<c10::Half, float>(out, sources, members, n, op);
    case at::kLong: return reduce_chunk<int64_t, int64_t>(out, sources, members, n, op);
    case at::kInt: return reduce_chunk<int32_t, int32_t>(out, sources, members, n, op);
    case at::kByte: return reduce_chunk<uint8_t, uint8_t>(out, sources, members, n, op);
    default: throw std::logic_error("shared-memory reduction of an unsupported type");
  }
}

}  // namespace

namespace {

const char* kind_name(int kind) {
  static const char* const kNames[] = {"all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "broadcast",
                                       "barrier"};
  return kind >= 0 && kind < 5 ? kNames[kind] : "an unknown collective";
}

// {bytes, kind | type << 8 | reduction << 16 | root << 24}
std::string describe(const uint64_t* d) {
  const int kind = static_cast<int>(d[1] & 0xff);
  std::string text = std::string(kind_name(kind)) + " of " + std::to_string(d[0]) + " bytes";
  if (kind != 4) text += std::string(" (") + c10::toString(static_cast<at::ScalarType>((d[1] >> 8) & 0xff)) + ")";
  if (kind == 3) text += " from root " + std::to_string(d[1] >> 24);
  return text;
}

}  // namespace

struct SharedMemoryTransport::Op {
  enum class Kind { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier };
  Kind kind;
  at::Tensor output;
  at::Tensor input;
  ReduceOp reduce_op = ReduceOp::kSum;
  int root = 0;
  uint64_t description[2] = {0, 0};  // what every member must be running alike

  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::string error;

  void finish(std::string why) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
      error = std::move(why);
    }
    finished.notify_all();
  }
};

namespace {

class SharedMemoryWork : public c10d::Work {
 public:
  explicit SharedMemoryWork(std::shared_ptr<SharedMemoryTransport::Op> op) : op_(std::move(op)) {}

  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(op_->mutex);
    return op_->done;
  }

  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(op_->mutex);
    const auto done = [&] { return op_->done; };
    if (timeout.count() <= 0) {
      op_->finished.wait(lock, done);
    } else if (!op_->finished.wait_for(lock, timeout, done)) {
      throw std::runtime_error("not finished after " + std::to_string(timeout.count()) +
                               " ms in shared memory");
    }
    if (!op_->error.empty()) throw std::runtime_error(op_->error);
    return true;
  }

 private:
  std::shared_ptr<SharedMemoryTransport::Op> op_;
};

}  // namespace

std::unique_ptr<SharedMemoryTransport> SharedMemoryTransport::connect(c10d::Store& store, int rank, int size,
                                                                      bool wanted, std::string* why,
                                                                      int64_t round_bytes) {
  if (size < 2) return nullptr;
  if (size > kMaxMembers) {
    if (why != nullptr) *why = "more than " + std::to_string(kMaxMembers) + " members";
    return nullptr;
  }
  if (round_bytes <= 0) round_bytes = default_round_bytes(size);
  round_bytes = align_up(std::max<int64_t>(round_bytes, size * kLine), kLine);  // a line per destination at least
  const int64_t bytes = segment_bytes(size, round_bytes);
  std::string error = wanted ? "" : "this rank does not take shared memory (FSDP_SHARED_MEMORY=0, or not on the CPU)";
  std::string name;
  int fd = -1;
  void* base = MAP_FAILED;
  bool named = false;  // rank 0's segment still has its name in /dev/shm
  const auto unlink_name = [&] {
    if (named) shm_unlink(name.c_str());
    named = false;
  };
  const auto release = [&] {
    unlink_name();
    if (base != MAP_FAILED) munmap(base, static_cast<size_t>(bytes));
    if (fd >= 0) close(fd);
  };
  const auto map = [&] {
    base = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) error = "mmap of " + name + ": " + errno_text(errno);
  };
  std::string first_failure;
  try {
    if (rank == 0) {
      std::random_device entropy;
      const uint64_t token = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
      char suffix[32];
      std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(token));
      if (error.empty()) {
        name = "/fsdp-" + std::to_string(getpid()) + "-" + suffix;
        fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
        named = fd >= 0;
        if (fd < 0) {
          error = "creating /dev/shm" + name + ": " + errno_text(errno);
        } else if (const int err = posix_fallocate(fd, 0, bytes); err != 0) {
          error = "reserving " + std::to_string(bytes >> 20) + " MiB in /dev/shm: " + errno_text(err);
        } else {
          map();
          if (error.empty()) std::memcpy(static_cast<char*>(base) + kTokenOffset, &token, sizeof token);
        }
      }
      const std::string published = error.empty() ? name + " " + suffix : std::string();
      store.set("fsdp-shm/name", std::vector<uint8_t>(published.begin(), published.end()));
    } else {
      const auto published_bytes = store.get("fsdp-shm/name");
      const std::string published(published_bytes.begin(), published_bytes.end());
      const auto space = published.find(' ');
      if (!error.empty()) {
        // this rank declines; its verdict says so
      } else if (space == std::string::npos) {
        error = "rank 0 made no segment";
      } else {
        name = published.substr(0, space);
        const uint64_t token = std::strtoull(published.c_str() + space + 1, nullptr, 16);
        fd = shm_open(name.c_str(), O_RDWR, 0600);
        struct stat st {};
        if (fd < 0) {
          error = "opening /dev/shm" + name + ": " + errno_text(errno) + " (another host or container?)";
        } else if (fstat(fd, &st) != 0 || st.st_size != bytes) {
          error = "/dev/shm" + name + " is not the segment rank 0 made";
        } else {
          map();
          uint64_t found = 0;
          if (error.empty()) std::memcpy(&found, static_cast<char*>(base) + kTokenOffset, sizeof found);
          if (error.empty() && found != token) error = "/dev/shm" + name + " holds another token (another host?)";
        }
      }
    }
    if (error.empty() && !lock_byte(fd, rank, F_OFD_SETLK, F_WRLCK)) error = "locking its byte: " + errno_text(errno);
    const std::string verdict = error.empty() ? "ok" : error;
    store.set("fsdp-shm/ok/" + std::to_string(rank), std::vector<uint8_t>(verdict.begin(), verdict.end()));
    for (int r = 0; r < size; ++r) {
      const auto v = store.get("fsdp-shm/ok/" + std::to_string(r));
      const std::string text(v.begin(), v.end());
      if (text != "ok" && first_failure.empty()) first_failure = "rank " + std::to_string(r) + ": " + text;
    }
  } catch (const std::exception& e) {
    release();
    throw std::runtime_error(std::string("agreeing on a shared-memory segment failed: ") + e.what() +
                             "; a peer died or never arrived");
  }
  // Every member has mapped it or given up: the name is no longer needed.
  unlink_name();
  if (!first_failure.empty()) {
    release();
    if (why != nullptr) *why = first_failure;
    return nullptr;
  }
  return std::unique_ptr<SharedMemoryTransport>(new SharedMemoryTransport(rank, size, fd, base, bytes, round_bytes));
}

uint32_t SharedMemoryTransport::rounds() const { return rounds_; }

SharedMemoryTransport::SharedMemoryTransport(int rank, int size, int fd, void* base, int64_t mapped,
                                             int64_t round_bytes)
    : rank_(rank), size_(size), fd_(fd), base_(static_cast<char*>(base)), mapped_(mapped), round_bytes_(round_bytes) {
  thread_ = std::thread([this] { progress_loop(); });
}

SharedMemoryTransport::~SharedMemoryTransport() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  thread_.join();
  munmap(base_, static_cast<size_t>(mapped_));
  close(fd_);
}

int64_t SharedMemoryTransport::default_round_bytes(int size) {
  const int64_t budget = int64_t{32} << 20;
  return std::min<int64_t>(int64_t{2} << 20, std::max<int64_t>(kPage, budget / (2 * size) / kPage * kPage));
}

bool SharedMemoryTransport::reduces(at::ScalarType type, bool floating_only) {
  switch (type) {
    case at::kFloat:
    case at::kDouble:
    case at::kBFloat16:
    case at::kHalf:
      return true;
    case at::kLong:
    case at::kInt:
    case at::kByte:
      return !floating_only;
    default:
      return false;
  }
}

c10::intrusive_ptr<c10d::Work> SharedMemoryTransport::submit(std::shared_ptr<Op> op) {
  auto work = c10::make_intrusive<SharedMemoryWork>(op);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(op));
  }
  queued_.notify_one();
  return work;
}

namespace {
std::shared_ptr<SharedMemoryTransport::Op> make_op(SharedMemoryTransport::Op::Kind kind, at::Tensor output,
                                                   at::Tensor input = {}, ReduceOp reduce_op = ReduceOp::kSum,
                                                   int root = 0) {
  auto op = std::make_shared<SharedMemoryTransport::Op>();
  op->kind = kind;
  op->output = std::move(output);
  op->input = std::move(input);
  op->reduce_op = reduce_op;
  op->root = root;
  const at::Tensor& sized = op->input.defined() ? op->input : op->output;
  op->description[0] = sized.defined() ? static_cast<uint64_t>(sized.nbytes()) : 0;
  op->description[1] = static_cast<uint64_t>(kind) |
                       (sized.defined() ? static_cast<uint64_t>(sized.scalar_type()) << 8 : 0) |
                       static_cast<uint64_t>(reduce_op) << 16 | static_cast<uint64_t>(root) << 24;
  return op;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> SharedMemoryTransport::all_gather(const at::Tensor& output, const at::Tensor& input) {
  return submit(make_op(Op::Kind::kAllGather, output, input));
}

c10::intrusive_ptr<c10d::Work> SharedMemoryTransport::reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                                                     ReduceOp reduce_op) {
  return submit(make_op(Op::Kind::kReduceScatter, output, input, reduce_op));
}

c10::intrusive_ptr<c10d::Work> SharedMemoryTransport::all_reduce(const at::Tensor& tensor, ReduceOp reduce_op) {
  return submit(make_op(Op::Kind::kAllReduce, tensor, {}, reduce_op));
}

c10::intrusive_ptr<c10d::Work> SharedMemoryTransport::broadcast(const at::Tensor& tensor, int root) {
  return submit(make_op(Op::Kind::kBroadcast, tensor, {}, ReduceOp::kSum, root));
}

c10::intrusive_ptr<c10d::Work> SharedMemoryTransport::barrier() { return submit(make_op(Op::Kind::kBarrier, {})); }

void SharedMemoryTransport::progress_loop() {
  while (true) {
    std::shared_ptr<Op> op;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    if (broken_.empty()) {
      try {
        run(*op);
      } catch (const std::exception& e) {
        broken_ = e.what();
        op->finish(broken_);
        continue;
      }
      op->finish("");
    } else {
      op->finish("the group failed earlier: " + broken_);
    }
  }
}

std::string SharedMemoryTransport::dead_member() const {
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    struct flock fl {};
    if (lock_byte(fd_, j, F_OFD_GETLK, F_WRLCK, &fl) && fl.l_type == F_UNLCK) {
      return "the group's rank " + std::to_string(j) + " exited";
    }
  }
  return "";
}

void SharedMemoryTransport::wait_until(const char* what, const std::function<bool()>& ready) {
  for (int i = 0; i < kSpins; ++i) {
    if (ready()) return;
    cpu_relax();
  }
  auto* doorbell = word(kDoorbellOffset);
  auto* sleepers = word(kSleepersOffset);
  int slept_ms = 0;
  while (true) {
    const uint32_t bell = doorbell->load();
    if (ready()) return;
    if (stopping_) throw std::runtime_error(std::string("the group shut down while waiting for ") + what);
    sleepers->fetch_add(1);
    futex_wait(doorbell, bell, kSleepMs);
    sleepers->fetch_sub(1);
    slept_ms += kSleepMs;
    if (slept_ms >= kLivenessEveryMs) {
      slept_ms = 0;
      if (ready()) return;
      const std::string dead = dead_member();
      // A peer may have finished its part and exited since ready() was read.
      if (!dead.empty() && ready()) return;
      if (!dead.empty()) throw std::runtime_error(dead + " while this rank waited for " + what + " (shared memory)");
    }
  }
}

template <typename Write, typename Read>
void SharedMemoryTransport::round(const uint64_t* description, Write&& write, Read&& read) {
  const uint32_t k = rounds_ + 1;
  const int64_t buffer = k & 1;
  const auto counter = [&](int which, int member) {
    return word(kCountersOffset + (which * size_ + member) * kLine);
  };
  const auto slot = [&](int member) -> char* {
    return base_ + data_offset(size_) + (buffer * size_ + member) * round_bytes_;
  };
  auto* doorbell = word(kDoorbellOffset);
  auto* sleepers = word(kSleepersOffset);
  const auto publish = [&](int which) {
    counter(which, rank_)->store(k, std::memory_order_release);
    doorbell->fetch_add(1);
    if (sleepers->load() > 0) futex_wake_all(doorbell);
  };
  const auto all_reached = [&](int which, uint32_t target) {
    for (int j = 0; j < size_; ++j) {
      if (!reached(counter(which, j)->load(std::memory_order_acquire), target)) return false;
    }
    return true;
  };
  const auto described = [&](int member) {
    return reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(counter(0, member)) + kDescriptionOffset +
                                       buffer * 2 * sizeof(uint64_t));
  };
  // This buffer (and description) was last read in round k - 2.
  wait_until("the others to read the previous round", [&] { return all_reached(1, k - 2); });
  std::memcpy(described(rank_), description, 2 * sizeof(uint64_t));
  write(slot(rank_));
  publish(0);
  wait_until("the others' data", [&] { return all_reached(0, k); });
  for (int j = 0; j < size_; ++j) {
    if (std::memcmp(described(j), description, 2 * sizeof(uint64_t)) != 0) {
      throw std::runtime_error("ranks issued different collectives: the group's rank " + std::to_string(j) +
                               " is in " + describe(described(j)) + " where rank " + std::to_string(rank_) +
                               " is in " + describe(description) + " (shared memory)");
    }
  }
  read(slot);
  publish(1);
  rounds_ = k;
}

namespace {
// fn(offset, length) over [0, n) in steps of `step`, at least once: a
// collective of nothing still meets the others, and is checked against them.
template <typename Fn>
void in_rounds(int64_t n, int64_t step, Fn&& fn) {
  int64_t off = 0;
  do {
    fn(off, std::min(step, n - off));
    off += step;
  } while (off < n);
}
}  // namespace

void SharedMemoryTransport::run(Op& op) {
  const int64_t r = round_bytes_;
  const uint64_t* what = op.description;
  switch (op.kind) {
    case Op::Kind::kAllGather: {
      const char* in = static_cast<const char*>(op.input.data_ptr());
      char* out = static_cast<char*>(op.output.data_ptr());
      const int64_t n = static_cast<int64_t>(op.input.nbytes());
      in_rounds(n, r, [&](int64_t off, int64_t len) {
        round(
            what, [&](char* mine) { std::memcpy(mine, in + off, len); },
            [&](const auto& slot) {
              for (int j = 0; j < size_; ++j) std::memcpy(out + j * n + off, slot(j), len);
            });
      });
      return;
    }
    case Op::Kind::kReduceScatter: {
      const int64_t es = static_cast<int64_t>(op.output.element_size());
      const int64_t n = op.output.numel();
      // Each round carries a sub-chunk for every destination, aligned to a line.
      const int64_t stride = r / size_ / kLine * kLine;
      const char* in = static_cast<const char*>(op.input.data_ptr());
      char* out = static_cast<char*>(op.output.data_ptr());
      const char* sources[kMaxMembers];
      in_rounds(n, stride / es, [&](int64_t off, int64_t len) {
        round(
            what,
            [&](char* mine) {
              for (int d = 0; d < size_; ++d) std::memcpy(mine + d * stride, in + (d * n + off) * es, len * es);
            },
            [&](const auto& slot) {
              for (int j = 0; j < size_; ++j) sources[j] = slot(j) + rank_ * stride;
              reduce(op.output.scalar_type(), out + off * es, sources, size_, len, op.reduce_op);
            });
      });
      return;
    }
    case Op::Kind::kAllReduce: {
      const int64_t es = static_cast<int64_t>(op.output.element_size());
      char* data = static_cast<char*>(op.output.data_ptr());
      const char* sources[kMaxMembers];
      in_rounds(op.output.numel(), r / es, [&](int64_t off, int64_t len) {
        round(
            what, [&](char* mine) { std::memcpy(mine, data + off * es, len * es); },
            [&](const auto& slot) {
              for (int j = 0; j < size_; ++j) sources[j] = slot(j);
              reduce(op.output.scalar_type(), data + off * es, sources, size_, len, op.reduce_op);
            });
      });
      return;
    }
    case Op::Kind::kBroadcast: {
      char* data = static_cast<char*>(op.output.data_ptr());
      in_rounds(static_cast<int64_t>(op.output.nbytes()), r, [&](int64_t off, int64_t len) {
        round(
            what,
            [&](char* mine) {
              if (rank_ == op.root) std::memcpy(mine, data + off, len);
            },
            [&](const auto& slot) {
              if (rank_ != op.root) std::memcpy(data + off, slot(op.root), len);
            });
      });
      return;
    }
    case Op::Kind::kBarrier:
      round(what, [](char*) {}, [](const auto&) {});
      return;
  }
}

}  // namespace fsdp::dist
