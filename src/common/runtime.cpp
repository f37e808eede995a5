#include "fsdp/common/runtime.h"

#include <dlfcn.h>
#include <malloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#ifdef FSDP_WITH_NCCL
#include <nccl.h>
#endif
#include <c10/util/Logging.h>
#ifdef C10_USE_GLOG
#include <glog/logging.h>
#endif

#include "fsdp/common/fault_point.h"
#include "fsdp/common/env.h"
#include "fsdp/common/flat_buffer.h"

namespace fsdp {

std::string loaded_blas_path() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos || line.find("libblas.so") == std::string::npos) continue;
    const std::string path = line.substr(slash);
    char resolved[4096];
    return ::realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
  }
  return "";
}

bool is_reference_blas(const std::string& path) {
  return path.find("/blas/libblas.so") != std::string::npos;
}

void quiet_library_logs() {
  // c10d logs its own view of a failure before throwing; we report the
  // failure once, in our words.
#ifdef C10_USE_GLOG
  // LibTorch 1.13 (Debian's) logs through glog: GLOG_minloglevel=0 brings
  // its logs back.
  if (std::getenv("GLOG_minloglevel") == nullptr) FLAGS_minloglevel = google::GLOG_FATAL;
  if (!google::IsGoogleLoggingInitialized()) google::InitGoogleLogging("fsdp");
#else
  // PyTorch's 2.x builds log through c10's own logger, which reads
  // TORCH_CPP_LOG_LEVEL (INFO, WARNING, ERROR, FATAL) at load time: set, it
  // brings the logs back; unset, only fatal messages pass.
  constexpr int kFatal = 3;
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = kFatal;
#endif
}

void keep_freed_memory() {
  // Training allocates and frees the same large tensors (logits, gathered
  // parameters, gradients) every step. glibc hands blocks over 128 KiB back
  // to the kernel on free and takes them again with fresh page faults, which
  // cost a third of a small model's step on 2 cores (measured: 1932 -> 2699
  // tokens/s for gpt2-mini at W=2). Keep freed memory in the heap instead;
  // MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ still override.
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 1 << 30);
  if (std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

// Without OMP_NUM_THREADS: the CPUs this process may use, divided among
// the ranks a launcher started on this node, so a plain run gets what
// `fsdp launch -n 1` gives its rank (LibTorch alone counts physical cores,
// half the CPUs on a hyperthreaded machine).
static int default_threads(const EnvMap& env) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                                  : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  long ranks = 1;
  for (const char* key : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}) {
    if (const auto v = env_int(env, key); v && *v > 0) {
      ranks = *v;
      break;
    }
  }
  return std::max(1, static_cast<int>(cpus / ranks));
}

void init_runtime() {
  check_fault_points();
  quiet_library_logs();
  keep_freed_memory();
  // See [Note: large CPU buffers] in flat_buffer.cpp.
  if (const char* cache = std::getenv("FSDP_CPU_CACHE"); cache == nullptr || std::string(cache) != "0") {
    memory::cache_large_cpu_allocations();
  }
  const EnvMap env = current_env();
  if (const auto threads = env_int(env, "OMP_NUM_THREADS"); threads && *threads > 0) {
    at::set_num_threads(static_cast<int>(*threads));
  } else {
    at::set_num_threads(default_threads(env));
  }
  const std::string blas = loaded_blas_path();
  if (is_reference_blas(blas)) {
    std::fprintf(stderr,
                 "warning: the reference BLAS (%s) is active: fp32 matmuls run ~13x slower. "
                 "Install libopenblas0-openmp (scripts/setup.sh does) or select it with "
                 "update-alternatives --config libblas.so.3-x86_64-linux-gnu\n",
                 blas.c_str());
  }
}

// The BLAS LibTorch was built with, from its build configuration: PyTorch's
// wheels link MKL statically, so no BLAS library shows among the loaded ones.
std::string built_in_blas() {
  const std::string config = at::show_config();
  const auto at = config.find("BLAS_INFO=");
  if (at == std::string::npos) return "";
  const auto begin = at + 10;
  return config.substr(begin, config.find_first_of(",\n", begin) - begin);
}

// The kernels MKL (when LibTorch carries it and exports its symbols) runs:
// the code branch it chose for this CPU, and whose answer to its vendor
// check it got. A CPU the check calls foreign gets no branch of its own
// (MKL_CBWR_AUTO), whatever its features ([Note: MKL's vendor check]).
static std::string mkl_kernels() {
  using Query = int (*)();
  const auto branch = reinterpret_cast<Query>(::dlsym(RTLD_DEFAULT, "mkl_serv_cbwr_get_auto_branch"));
  if (branch == nullptr) return "";
  // This function is in the program itself, whether it links fsdp.cpp
  // statically or not; the check's answer is the program's when its
  // definition lies in the same object.
  Dl_info check{}, self{};
  const void* answer = ::dlsym(RTLD_DEFAULT, "mkl_serv_intel_cpu_true");
  const bool ours = answer != nullptr && ::dladdr(answer, &check) != 0 &&
                    ::dladdr(reinterpret_cast<const void*>(&mkl_kernels), &self) != 0 &&
                    check.dli_fbase == self.dli_fbase;
  const std::string whose = ours ? "this program answers MKL's vendor check (with MKL's own answer if FSDP_MKL_VENDOR_CHECK=1)"
                                 : "MKL answers its vendor check itself";
  const int b = branch();
  // mkl_cbwr.h: BRANCH_OFF 1, AUTO 2, COMPATIBLE 3, then one per instruction set.
  if (b == 2 || b == 3) {
    return "MKL kernels: generic (branch " + std::to_string(b) +
           "): not chosen by the CPU's features, as on a CPU MKL's vendor check calls foreign; " + whose + "\n";
  }
  static const std::pair<int, const char*> kNames[] = {{4, "SSE2"}, {6, "SSSE3"}, {7, "SSE4.1"},   {8, "SSE4.2"},
                                                       {9, "AVX"},  {10, "AVX2"}, {12, "AVX-512"}, {14, "AVX-512 E1"}};
  std::string name = "branch " + std::to_string(b);
  for (const auto& [value, known] : kNames) {
    if (value == b) name = known;
  }
  return "MKL kernels: " + name + ", chosen by the CPU's features; " + whose + "\n";
}

std::string version_report() {
  const std::string blas = loaded_blas_path();
  std::string blas_kind = blas.find("openblas") != std::string::npos ? "OpenBLAS"
                          : blas.find("blis") != std::string::npos   ? "BLIS"
                          : blas.find("mkl") != std::string::npos    ? "MKL"
                          : is_reference_blas(blas)                  ? "reference BLAS (slow)"
                          : blas.empty()                             ? ""
                                                                     : "unknown";
  if (blas.empty()) {
    const std::string built_in = built_in_blas();
    blas_kind = built_in.empty() ? "none found" : built_in + " (linked into LibTorch)";
  }
  std::string out = "fsdp.cpp " FSDP_VERSION "\n";
  out += "LibTorch " TORCH_VERSION "\n";
#ifdef FSDP_WITH_NCCL
  out += "backends: gloo (CPU), nccl (CUDA)\n";
#else
  out += "backends: gloo (CPU); nccl not built (this LibTorch has no CUDA)\n";
#endif
  out += "BLAS: " + blas_kind + (blas.empty() ? "" : " (" + blas + ")") + "\n";
  out += mkl_kernels();
  out += "threads: " + std::to_string(at::get_num_threads()) + " intra-op in this process (fsdp launch gives each rank cores / ranks)\n";
#ifdef FSDP_WITH_CUDA
  out += "CUDA: built with CUDA " FSDP_CUDA_VERSION " and NCCL " + std::to_string(NCCL_MAJOR) + "." +
         std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH) + "; ";
  if (torch::cuda::is_available()) {
    out += std::to_string(torch::cuda::device_count()) + " device(s) visible\n";
  } else {
    out += "no CUDA device is visible\n";
  }
#else
  out += "CUDA: not in this build (a CPU LibTorch)\n";
#endif
  return out;
}

}  // namespace fsdp
