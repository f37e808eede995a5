#pragma once
// A recording (allocation_log.h) in the format torch.cuda.memory._dump_snapshot
// writes, so PyTorch's viewer (pytorch.org/memory_viz, or
// `python -m torch.cuda._memory_viz trace_plot FILE -o FILE.html`) shows
// it. The CPU allocator has no segments: each block is its own segment, an
// allocation is a "segment_alloc" and an "alloc" entry, a free a
// "free_completed" and a "segment_free" one, and each entry's one frame
// names the phase that made it. Light header.

#include <string>

#include "fsdp/common/allocation_log.h"

namespace fsdp::memory {

std::string memory_snapshot_pickle(const Recording& recording, int rank);
// Written atomically; throws fsdp::Error naming the path.
void write_memory_snapshot(const Recording& recording, int rank, const std::string& path);

}  // namespace fsdp::memory
