#include "fsdp/common/flat_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include "fsdp/common/allocation_log.h"
#include "fsdp/common/compat.h"
#include "fsdp/common/error.h"

namespace fsdp::memory {

// [Note: large CPU buffers]
// A training step frees and re-allocates the same large tensors every step:
// activations, their gradients, and FSDP's own flat buffers (a unit's
// gathered parameters, its gradient buffer, a reduce-scatter's receive
// buffer), in an order that differs between forward and backward. glibc's
// default maps and unmaps each one, paying page faults every step; told to
// keep freed memory (keep_freed_memory) it splits freed chunks for requests
// of other sizes and fragments. Measured on GPT-2 d6 at W=2 (fp32, 4 x 256):
// FULL_SHARD's heap grew to 1.5 GB for a live peak near 0.6 GB, and its peak
// RSS ended above NO_SHARD's.
//
// So blocks of 1 MiB or more come from here, as CUDA's caching allocator does
// on the GPU: mapped directly, and once freed kept whole for the next request
// of the same size class (a power of two and its quarters, so a block wastes
// at most a fifth of address space, and pages never touched cost no memory).
// A step's shapes repeat, so after the first step every large request is a
// cache hit: no page faults, no fragmentation. Shapes that keep changing
// (generation with a growing sequence) miss; a miss first hands back the
// blocks no request has taken for the last kStaleAfter large allocations,
// which bounds what the cache keeps without touching what a step reuses. Small requests and CUDA ones go to the device's own
// allocator (CUDA's caches already).
//
// FSDP's flat buffers use a second instance of the same allocator, so their
// storage says they are FSDP's: that is how a parameter already held by a
// unit is recognised (fully_shard), without a table of sharded tensors.

namespace {

constexpr size_t kCachedFrom = size_t{1} << 20;
constexpr uint64_t kStaleAfter = 4096;

size_t size_class(size_t n) {
  size_t pow2 = kCachedFrom;
  while (pow2 * 2 <= n) pow2 *= 2;
  const size_t quarter = pow2 / 4;
  return (n + quarter - 1) / quarter * quarter;
}

class BlockCache {
 public:
  static BlockCache& get() {
    static auto* cache = new BlockCache();  // outlives static tensors freed at exit
    return *cache;
  }

  // `size` is a size class; `requested` what the caller asked for (the
  // pages it can touch), which is what used_bytes() counts.
  void* take(size_t size, size_t requested) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++allocations_;
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back().ptr;
        it->second.pop_back();
        free_bytes_ -= size;
        used_bytes_ += requested;
        live_[p] = {size, requested};
        return p;
      }
      release_locked(allocations_ > kStaleAfter ? allocations_ - kStaleAfter : 0);
    }
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        release_locked(kEverything);  // what is kept may be what is missing
      }
      p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      FSDP_CHECK(p != MAP_FAILED, "cannot allocate ", size >> 20, " MiB for a CPU tensor: ", std::strerror(err));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    used_bytes_ += requested;
    live_[p] = {size, requested};
    return p;
  }

  // Runs on whichever thread drops the last reference (Gloo's, too).
  // False when `p` is not a block of this cache.
  bool give_back(void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = live_.find(p);
    if (it == live_.end()) return false;
    const auto [size, requested] = it->second;
    live_.erase(it);
    free_[size].push_back({p, allocations_});
    free_bytes_ += size;
    used_bytes_ -= requested;
    return true;
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_locked(kEverything);
  }
  int64_t free_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(free_bytes_);
  }
  int64_t used_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(used_bytes_);
  }

 private:
  static constexpr uint64_t kEverything = ~uint64_t{0};

  // Unmaps the kept blocks freed before allocation number `before`.
  void release_locked(uint64_t before) {
    for (auto it = free_.begin(); it != free_.end();) {
      auto& blocks = it->second;
      const auto stale = std::stable_partition(blocks.begin(), blocks.end(),
                                               [&](const Kept& k) { return k.freed_at >= before; });
      for (auto b = stale; b != blocks.end(); ++b) {
        munmap(b->ptr, it->first);
        free_bytes_ -= it->first;
      }
      blocks.erase(stale, blocks.end());
      it = blocks.empty() ? free_.erase(it) : std::next(it);
    }
  }

  struct Kept {
    void* ptr;
    uint64_t freed_at;  // the allocation count when it was freed
  };
  std::mutex mutex_;
  std::map<size_t, std::vector<Kept>> free_;  // by size class; the latest freed last
  std::unordered_map<void*, std::pair<size_t, size_t>> live_;  // handed out: class size, requested
  uint64_t allocations_ = 0;
  size_t free_bytes_ = 0;
  size_t used_bytes_ = 0;
};

std::atomic<bool> g_counting{false};       // count_cpu_allocations was called
std::atomic<bool> g_cache_general{false};  // cache_large_cpu_allocations was called

// One deleter for every CPU pointer this allocator hands out, small ones
// (from LibTorch's default allocator) included: LibTorch's raw_allocate /
// raw_deallocate need the context to be the pointer and one deleter.
void free_cpu(void* ptr) {
  if (g_counting.load(std::memory_order_relaxed)) {
    // A counted block below the cache's size came from the default
    // allocator: no need to ask the cache.
    const int64_t size = on_free(ptr);
    if (size >= 0 && static_cast<size_t>(size) < kCachedFrom) {
      c10::GetDefaultCPUAllocator()->raw_deleter()(ptr);
      return;
    }
  }
  if (!BlockCache::get().give_back(ptr)) c10::GetDefaultCPUAllocator()->raw_deleter()(ptr);
}

class LargeBlockAllocator final : public c10::Allocator {
 public:
  // `caches`: large blocks come from the cache (null: only while
  // cache_large_cpu_allocations has set it).
  LargeBlockAllocator(c10::DeviceType type, const std::atomic<bool>* caches) : type_(type), caches_(caches) {}

  c10::DataPtr allocate(size_t nbytes) FSDP_ALLOCATE_CONST override {
    if (type_ != c10::DeviceType::CPU) return base()->allocate(nbytes);
    void* ptr = nullptr;
    if (nbytes >= kCachedFrom && (caches_ == nullptr || caches_->load(std::memory_order_relaxed))) {
      ptr = BlockCache::get().take(size_class(nbytes), nbytes);
    } else {
      c10::DataPtr small = base()->allocate(nbytes);
      ptr = small.get();
      // Counted, the block takes free_cpu as its deleter (which hands it
      // to the default's), so that its free is seen too.
      if (ptr == nullptr || !g_counting.load(std::memory_order_relaxed)) return small;
      FSDP_CHECK(small.get_context() == ptr, "LibTorch's CPU allocator returned a block with a context");
      small.release_context();
    }
    if (g_counting.load(std::memory_order_relaxed)) on_allocate(ptr, static_cast<int64_t>(nbytes));
    return {ptr, ptr, &free_cpu, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return type_ == c10::DeviceType::CPU ? &free_cpu : base()->raw_deleter();
  }
#if FSDP_ALLOCATOR_NEEDS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    type_ == c10::DeviceType::CPU ? default_copy_data(dest, src, count) : base()->copy_data(dest, src, count);
  }
#endif

 private:
  // The CPU default, not GetAllocator(CPU): that may be this allocator. A
  // CUDA allocator is registered when its library loads, so it is looked up
  // per call.
  c10::Allocator* base() const {
    return type_ == c10::DeviceType::CPU ? c10::GetDefaultCPUAllocator() : c10::GetAllocator(type_);
  }
  c10::DeviceType type_;
  const std::atomic<bool>* caches_;
};

// Never destroyed: c10's table of allocators, and tensors freed during
// static destruction, may still reach them.
LargeBlockAllocator& flat_cpu = *new LargeBlockAllocator(c10::DeviceType::CPU, nullptr);
LargeBlockAllocator& flat_cuda = *new LargeBlockAllocator(c10::DeviceType::CUDA, nullptr);
LargeBlockAllocator& general_cpu = *new LargeBlockAllocator(c10::DeviceType::CPU, &g_cache_general);

c10::Allocator* flat_allocator(c10::DeviceType type) {
  if (type == c10::DeviceType::CPU) return &flat_cpu;
  if (type == c10::DeviceType::CUDA) return &flat_cuda;
  throw Error(detail::concat("fsdp: cannot hold flat buffers on device type ", type, ": supported are CPU and CUDA"));
}

}  // namespace

at::Tensor empty_flat(int64_t numel, const at::TensorOptions& options) {
  const c10::Device device = options.device();
  const at::ScalarType dtype = options.dtype().toScalarType();
  const auto key = c10::computeDispatchKey(dtype, options.layout(), device);
  return at::Tensor(
      at::detail::empty_generic({numel}, flat_allocator(device.type()), c10::DispatchKeySet(key), dtype, c10::nullopt));
}

at::Tensor flat_copy(const at::Tensor& t, at::ScalarType dtype) {
  at::Tensor out = empty_flat(t.numel(), t.options().dtype(dtype));
  out.copy_(t.reshape({-1}));
  return out;
}

bool is_flat_buffer(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return false;
  const c10::Allocator* a = t.storage().allocator();
  return a == &flat_cpu || a == &flat_cuda;
}

void cache_large_cpu_allocations() {
  g_cache_general = true;
  // Priority above LibTorch's own registration (0), so it stays.
  c10::SetAllocator(c10::DeviceType::CPU, &general_cpu, /*priority=*/1);
}

void count_cpu_allocations() {
  c10::SetAllocator(c10::DeviceType::CPU, &general_cpu, /*priority=*/1);
  g_counting = true;
}

int64_t large_cpu_bytes_in_use() { return BlockCache::get().used_bytes(); }
int64_t cached_cpu_bytes() { return BlockCache::get().free_bytes(); }
void release_cached_cpu_blocks() { BlockCache::get().release(); }

}  // namespace fsdp::memory
