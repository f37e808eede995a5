#pragma once
// Every allocation and free of LibTorch's CPU allocator, counted: the bytes
// of tensor memory held now and at most (the number `fsdp plan` predicts),
// and, while recording, each event with its time and the step's phase
// ("forward h.3", "backward h.3", "optimizer"). The CPU allocator of
// flat_buffer.h feeds it once count_cpu_allocations() is called;
// io/memory_snapshot.h writes a recording for PyTorch's memory viewer.
// Light header: no LibTorch.

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::memory {

struct AllocationEvent {
  int64_t time_us = 0;  // since the recording started
  uint64_t addr = 0;
  int64_t size = 0;   // bytes; negative for a free
  int32_t phase = 0;  // index into Recording::phases
};

struct LiveBlock {
  uint64_t addr = 0;
  int64_t size = 0;
  int32_t phase = 0;  // the phase that allocated it; 0 before the recording started
};

struct Recording {
  std::vector<std::string> phases;  // phases[0] is "before recording"
  std::vector<AllocationEvent> events;
  std::vector<LiveBlock> live_at_end;  // every block still held when the recording stopped
  int64_t bytes_at_start = 0;          // held when the recording started
  int64_t peak_bytes = 0;              // the most held at once during the recording
  int64_t peak_event = -1;             // the event that reached it (-1: the start)
};

// Called by the allocator for every block it hands out or takes back.
// on_free returns the block's size, or -1 for a block not counted (allocated
// before counting began).
void on_allocate(const void* addr, int64_t size);
int64_t on_free(const void* addr);

// Tensor bytes held now, and at most since the last reset.
int64_t allocated_bytes();
int64_t peak_allocated_bytes();
void reset_allocated_peak();

// The phase events are labelled with until the next call; process-wide
// (collectives and intra-op threads allocate on other threads). A caller
// that sets the same phase every step interns its name once.
int32_t phase_id(const std::string& name);
void set_phase(int32_t id);
void set_phase(const std::string& name);

void start_recording();
bool recording();
// Stops and hands over what was recorded.
Recording stop_recording();

}  // namespace fsdp::memory
