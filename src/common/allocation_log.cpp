#include "fsdp/common/allocation_log.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <unordered_map>

namespace fsdp::memory {
namespace {

struct Block {
  int64_t size;
  int32_t phase;
};

// One mutex: the hook runs on whichever thread allocates, and a free must
// find the size its allocation recorded.
struct Log {
  std::mutex mutex;
  std::unordered_map<uint64_t, Block> live;
  int64_t bytes = 0;
  int64_t peak = 0;
  std::vector<std::string> phases{"before recording"};
  std::unordered_map<std::string, int32_t> phase_ids{{"before recording", 0}};
  int32_t phase = 0;
  bool recording = false;
  std::chrono::steady_clock::time_point started;
  Recording current;
};

Log& log() {
  static Log* l = new Log();  // never destroyed: tensors are freed during static destruction
  return *l;
}

int64_t now_us(const Log& l) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - l.started).count();
}

void record(Log& l, uint64_t addr, int64_t size, int32_t phase) {
  l.current.events.push_back({now_us(l), addr, size, phase});
  if (l.bytes > l.current.peak_bytes) {
    l.current.peak_bytes = l.bytes;
    l.current.peak_event = static_cast<int64_t>(l.current.events.size()) - 1;
  }
}

}  // namespace

void on_allocate(const void* addr, int64_t size) {
  auto& l = log();
  const auto key = reinterpret_cast<uint64_t>(addr);
  std::lock_guard<std::mutex> lock(l.mutex);
  auto [it, added] = l.live.try_emplace(key, Block{size, l.phase});
  if (!added) {
    // Its free was never seen (it went another way): it is gone now.
    l.bytes -= it->second.size;
    it->second = {size, l.phase};
  }
  l.bytes += size;
  l.peak = std::max(l.peak, l.bytes);
  if (l.recording) record(l, key, size, l.phase);
}

int64_t on_free(const void* addr) {
  auto& l = log();
  const auto key = reinterpret_cast<uint64_t>(addr);
  std::lock_guard<std::mutex> lock(l.mutex);
  const auto it = l.live.find(key);
  if (it == l.live.end()) return -1;
  const int64_t size = it->second.size;
  l.live.erase(it);
  l.bytes -= size;
  if (l.recording) record(l, key, -size, l.phase);
  return size;
}

int64_t allocated_bytes() {
  auto& l = log();
  std::lock_guard<std::mutex> lock(l.mutex);
  return l.bytes;
}

int64_t peak_allocated_bytes() {
  auto& l = log();
  std::lock_guard<std::mutex> lock(l.mutex);
  return l.peak;
}

void reset_allocated_peak() {
  auto& l = log();
  std::lock_guard<std::mutex> lock(l.mutex);
  l.peak = l.bytes;
}

int32_t phase_id(const std::string& name) {
  auto& l = log();
  std::lock_guard<std::mutex> lock(l.mutex);
  const auto [it, added] = l.phase_ids.emplace(name, static_cast<int32_t>(l.phases.size()));
  if (added) l.phases.push_back(name);
  return it->second;
}

void set_phase(int32_t id) {
  auto& l = log();
  std::lock_guard<std::mutex> lock(l.mutex);
  l.phase = id;
}

void set_phase(const std::string& name) { set_phase(phase_id(name)); }

void start_recording() {
  auto& l = log();
  std::lock_guard<std::mutex> lock(l.mutex);
  l.current = Recording();
  l.current.bytes_at_start = l.bytes;
  l.current.peak_bytes = l.bytes;
  // Blocks allocated before now are labelled "before recording".
  for (auto& entry : l.live) entry.second.phase = 0;
  l.started = std::chrono::steady_clock::now();
  l.recording = true;
}

bool recording() {
  auto& l = log();
  std::lock_guard<std::mutex> lock(l.mutex);
  return l.recording;
}

Recording stop_recording() {
  auto& l = log();
  std::lock_guard<std::mutex> lock(l.mutex);
  l.recording = false;
  Recording out = std::move(l.current);
  l.current = Recording();
  out.phases = l.phases;
  out.live_at_end.reserve(l.live.size());
  for (const auto& [addr, block] : l.live) out.live_at_end.push_back({addr, block.size, block.phase});
  std::sort(out.live_at_end.begin(), out.live_at_end.end(),
            [](const LiveBlock& a, const LiveBlock& b) { return a.addr < b.addr; });
  return out;
}

}  // namespace fsdp::memory
