#pragma once
// Removing a file or a directory with everything under it (symbolic links
// removed, not followed; a missing path is no error), as
// std::filesystem::remove_all does. Light header: no LibTorch.
//
// [Note: no std::filesystem::remove_all]
// PyTorch's wheels export their own copies of libstdc++'s std::filesystem
// functions, and the dynamic linker binds our calls to the first library
// that defines them. LibTorch 2.11's libtorch.so (the CUDA 13 wheel) defines
// a remove_all that jumps to address 0 on a non-empty directory: `fsdp
// launch` crashed removing its flight-recorder folder after every rank had
// succeeded (found on an H200 with cuda-gdb; scripts/device_check.sh). Our
// code removes trees with POSIX calls instead, which no LibTorch redefines.

#include <cstdint>
#include <string>
#include <system_error>

namespace fsdp::io {

// Returns how many entries were removed; on failure sets `ec` (the first
// error, as errno) and returns UINTMAX_MAX, leaving what it had not reached.
std::uintmax_t remove_tree(const std::string& path, std::error_code& ec) noexcept;
// The same, throwing fsdp::Error naming the path and the reason.
std::uintmax_t remove_tree(const std::string& path);

}  // namespace fsdp::io
