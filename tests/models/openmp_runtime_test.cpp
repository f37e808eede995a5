// Our OpenMP code (at::parallel_for compiled in our translation units, the
// fused loops) and LibTorch's own kernels must share one OpenMP runtime and
// one thread pool: two runtimes would each keep a pool, oversubscribing the
// cores. With PyTorch's wheels that means the libgomp bundled beside
// libtorch_cpu (cmake/torch.cmake), with Debian's LibTorch GCC's own.

#include <dirent.h>

#include <fstream>
#include <mutex>
#include <set>
#include <string>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace fsdp::testing::openmp_runtime_test {
namespace {

std::set<std::string> loaded_openmp_runtimes() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> paths;
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash != std::string::npos && line.find("libgomp") != std::string::npos) paths.insert(line.substr(slash));
  }
  return paths;
}

int thread_count() {
  int n = 0;
  DIR* dir = ::opendir("/proc/self/task");
  while (const dirent* entry = ::readdir(dir)) n += entry->d_name[0] != '.';
  ::closedir(dir);
  return n;
}

TEST(OpenMp, OurLoopsAndLibTorchShareOneRuntimeAndOnePool) {
  at::set_num_threads(2);
  // LibTorch's own parallel kernel starts its pool.
  const auto a = torch::randn({1 << 22});
  EXPECT_GT((a * a).sum().item<float>(), 0);
  const int threads_after_libtorch = thread_count();

  // Ours: at::parallel_for instantiated in this (OpenMP-compiled) file.
  std::mutex mutex;
  std::set<int> workers;
  at::parallel_for(0, 1 << 20, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mutex);
    workers.insert(at::get_thread_num());
  });
  EXPECT_EQ(workers.size(), 2u) << "our at::parallel_for must run on both threads (OpenMP in our compile)";
  EXPECT_EQ(thread_count(), threads_after_libtorch) << "our loop started threads of its own: a second pool";
  const auto runtimes = loaded_openmp_runtimes();
  ASSERT_EQ(runtimes.size(), 1u) << "OpenMP runtimes loaded: " << runtimes.size();
}

}  // namespace
}  // namespace fsdp::testing::openmp_runtime_test
