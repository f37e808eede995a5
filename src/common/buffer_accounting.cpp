#include "fsdp/common/buffer_accounting.h"

#include <array>
#include <atomic>
#include <mutex>

namespace fsdp::memory {
namespace {

// A mutex rather than atomics: the total's peak must see all kinds at once.
struct Counters {
  std::mutex mutex;
  std::array<int64_t, kBufferKinds> current{};
  std::array<int64_t, kBufferKinds> peak{};
  int64_t total = 0;
  int64_t total_peak = 0;
};

Counters& counters() {
  static Counters c;
  return c;
}

size_t index(BufferKind kind) { return static_cast<size_t>(kind); }

}  // namespace

void count(BufferKind kind, int64_t delta_bytes) {
  auto& c = counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  int64_t& now = c.current[index(kind)];
  now += delta_bytes;
  if (now > c.peak[index(kind)]) c.peak[index(kind)] = now;
  c.total += delta_bytes;
  if (c.total > c.total_peak) c.total_peak = c.total;
}

int64_t current_bytes(BufferKind kind) {
  auto& c = counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.current[index(kind)];
}

int64_t peak_bytes(BufferKind kind) {
  auto& c = counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.peak[index(kind)];
}

int64_t current_total_bytes() {
  auto& c = counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.total;
}

int64_t peak_total_bytes() {
  auto& c = counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.total_peak;
}

void reset_peaks() {
  auto& c = counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.peak = c.current;
  c.total_peak = c.total;
}

}  // namespace fsdp::memory
