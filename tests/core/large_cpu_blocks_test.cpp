// The CPU block cache behind large tensors and FSDP's flat buffers
// (src/common/flat_buffer.cpp). The test binary runs init_runtime, which
// installs it as LibTorch's CPU allocator.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fsdp/common/compat.h"
#include "fsdp/common/flat_buffer.h"

namespace fsdp::testing::large_cpu_blocks_test {
namespace {

constexpr int64_t kMiB = 1 << 20;

torch::Tensor floats_of(int64_t bytes) { return torch::empty({bytes / 4}); }

TEST(LargeCpuBlocks, AFreedBlockServesTheNextRequestOfItsSize) {
  auto a = floats_of(3 * kMiB);
  void* first = a.data_ptr();
  const int64_t in_use = memory::large_cpu_bytes_in_use();
  EXPECT_GE(in_use, 3 * kMiB);
  a = torch::Tensor();
  // At most: Gloo's worker may drop an earlier collective's buffer meanwhile.
  EXPECT_LE(memory::large_cpu_bytes_in_use(), in_use - 3 * kMiB);
  EXPECT_GE(memory::cached_cpu_bytes(), 3 * kMiB);
  auto b = floats_of(3 * kMiB);
  EXPECT_EQ(b.data_ptr(), first) << "same size class: the kept block, already faulted in";
}

TEST(LargeCpuBlocks, SmallTensorsStayWithTheDefaultAllocator) {
  const int64_t in_use = memory::large_cpu_bytes_in_use();
  auto small = floats_of(64 << 10);
  EXPECT_LE(memory::large_cpu_bytes_in_use(), in_use);
}

TEST(LargeCpuBlocks, BlocksUnusedForLongAreHandedBackOnAMiss) {
  memory::release_cached_cpu_blocks();  // what earlier tests left: the request below must miss
  EXPECT_EQ(memory::cached_cpu_bytes(), 0);
  floats_of(64 * kMiB);  // freed at once: kept
  EXPECT_EQ(memory::cached_cpu_bytes(), 64 * kMiB);
  for (int i = 0; i < 4100; ++i) floats_of(kMiB);  // one block, reused: every request a hit
  EXPECT_GE(memory::cached_cpu_bytes(), 64 * kMiB) << "hits hand nothing back";
  floats_of(2 * kMiB + 4096);  // a size class with nothing kept: a miss
  // Left: the 1 MiB block, just used, and the one just freed.
  EXPECT_EQ(memory::cached_cpu_bytes(), kMiB + 5 * kMiB / 2) << "the block idle for 4100 allocations was kept";
}

TEST(LargeCpuBlocks, FlatBuffersAreMarkedAndStaySoWhenResized) {
  auto flat = memory::empty_flat(kMiB, torch::kFloat);
  EXPECT_TRUE(memory::is_flat_buffer(flat));
  EXPECT_FALSE(memory::is_flat_buffer(floats_of(4 * kMiB)));
  EXPECT_FALSE(memory::is_flat_buffer(floats_of(1024)));
  compat::resize_storage_bytes(flat, 0);
  compat::resize_storage_bytes(flat, 4 * kMiB);
  EXPECT_TRUE(memory::is_flat_buffer(flat));
  flat.fill_(2.0f);
  EXPECT_EQ(flat.sum().item<double>(), 2.0 * kMiB);
}

TEST(LargeCpuBlocks, LibTorchsRawAllocationInterfaceWorks) {
  // Kernels that take scratch memory through raw_allocate need the context
  // to be the pointer and one deleter for every size.
  auto* allocator = c10::GetAllocator(c10::DeviceType::CPU);
  for (const size_t n : {size_t{256}, size_t{3 * kMiB}}) {
    const bool large = n >= kMiB;  // small requests stay with the default allocator
    const int64_t before = memory::large_cpu_bytes_in_use();
    void* p = allocator->raw_allocate(n);
    ASSERT_NE(p, nullptr) << n;
    static_cast<char*>(p)[0] = 1;
    static_cast<char*>(p)[n - 1] = 1;
    if (large) {
      EXPECT_GE(memory::large_cpu_bytes_in_use(), before + static_cast<int64_t>(n)) << "counted while in use";
    }
    allocator->raw_deallocate(p);
    if (large) {
      // At most: Gloo's worker may drop an earlier collective's buffer meanwhile.
      EXPECT_LE(memory::large_cpu_bytes_in_use(), before) << "uncounted once freed";
    }
  }
}

}  // namespace
}  // namespace fsdp::testing::large_cpu_blocks_test
