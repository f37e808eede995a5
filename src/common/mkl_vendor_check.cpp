// [Note: MKL's vendor check]
// PyTorch's wheels link Intel MKL into libtorch_cpu.so and export its
// symbols. MKL picks its matrix-product kernels from the CPU's features
// only when mkl_serv_intel_cpu_true() says the CPU is Intel's; on any other
// it takes a generic path. On the development VM (AMD EPYC, family 25
// model 17, AVX-512; LibTorch 2.13) that path made gpt2-d6's fp32 step
// 1.34x slower and its matmul-limited time 1.46x longer
// (bench/mkl_vendor_check.py). The kernels MKL then chooses still follow
// the features CPUID reports, so they run on any CPU that reports them.
//
// The project's executables link this file and export both functions
// (CMakeLists.txt, fsdp_use_pch): the dynamic linker binds MKL's own
// calls to the executable's definitions first; `fsdp --version` says whose
// answer MKL got and which kernels it chose. FSDP_MKL_VENDOR_CHECK=1
// hands the answer back to MKL. Builds whose LibTorch has no MKL (Debian's
// 1.13, on OpenBLAS) never call them.

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

using VendorCheck = int (*)();

// MKL's own answer, from the next object that defines `name`: the
// LibTorch an executable links. A library preloaded into Python finds none
// there (Python opens LibTorch privately); it then answers as MKL would,
// from the CPU's vendor.
int mkl_answer(const char* name) {
  const auto real = reinterpret_cast<VendorCheck>(::dlsym(RTLD_NEXT, name));
  if (real != nullptr) return real();
  __builtin_cpu_init();
  return __builtin_cpu_is("intel") ? 1 : 0;
}

// Whether FSDP_MKL_VENDOR_CHECK asks for MKL's own check.
bool read_setting() {
  const char* value = std::getenv("FSDP_MKL_VENDOR_CHECK");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "0") == 0) return false;
  if (std::strcmp(value, "1") == 0) return true;
  std::fprintf(stderr,
               "fsdp: environment variable FSDP_MKL_VENDOR_CHECK is '%s': expected 0 (MKL's kernels chosen by "
               "the CPU's features, the default) or 1 (MKL's own vendor check)\n",
               value);
  std::exit(2);
}

// Read once: at the first call, which may come from a library's static
// initialisation, or else before main, so that a bad value stops the
// program before it does anything.
bool mkl_decides() {
  static const bool decides = read_setting();
  return decides;
}
[[maybe_unused]] const bool kReadBeforeMain = mkl_decides();

}  // namespace

extern "C" __attribute__((visibility("default"))) int mkl_serv_intel_cpu_true() {
  static const int answer = mkl_decides() ? mkl_answer("mkl_serv_intel_cpu_true") : 1;
  return answer;
}

extern "C" __attribute__((visibility("default"))) int mkl_serv_intel_cpu() {
  static const int answer = mkl_decides() ? mkl_answer("mkl_serv_intel_cpu") : 1;
  return answer;
}
