#pragma once
// Process start-up shared by every fsdp program: intra-op threads and a
// check that a fast BLAS is the one loaded.

#include <string>

namespace fsdp {

// Applies OMP_NUM_THREADS (set per rank by `fsdp launch`) to LibTorch's
// intra-op pool, keeps freed memory for reuse, and warns on stderr when the
// reference BLAS is active.
// Also silences LibTorch's logs below FATAL unless GLOG_minloglevel (1.13,
// glog) or TORCH_CPP_LOG_LEVEL (2.x, c10's logger) is set: every failure it
// would log reaches the user as our own error.
void init_runtime();
void quiet_library_logs();
// Tunes glibc malloc to keep large freed blocks (see runtime.cpp).
void keep_freed_memory();

// The real path of the libblas.so.3 this process loaded, or "" if none.
std::string loaded_blas_path();

// What a bug report needs: fsdp.cpp and LibTorch versions, backends, the
// BLAS in use, threads and CUDA (`fsdp --version`).
std::string version_report();

// True when `path` is Debian's reference BLAS (not OpenBLAS, BLIS or MKL).
bool is_reference_blas(const std::string& path);

}  // namespace fsdp
