#pragma once
// Reads a whole file once, front to back, in large blocks, with the next
// block's read in flight while the caller looks at the current one: the
// load side of AtomicFile's streamed writes (see [Note: checkpoint reads
// at the disk's pace] in streamed_read.cpp).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace fsdp::io {

// Calls `on_block(offset, data, size)` for consecutive blocks covering the
// file, and returns the file's CRC-32 (zlib's), computed as they pass.
// Throws fsdp::Error naming the file when it cannot be read whole.
uint32_t read_streamed(const std::string& path,
                       const std::function<void(uint64_t offset, const char* data, size_t size)>& on_block);

}  // namespace fsdp::io
