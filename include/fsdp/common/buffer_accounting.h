#pragma once
// Bytes of the transient buffers FSDP allocates, by kind: gathered
// parameters, unsharded gradients and communication buffers (all-gather
// inputs, reduce-scatter inputs and receive buffers, reduced shards).
// Counted where they are allocated and released, process-wide (one model per
// process), with peaks, so tests and telemetry can bound what a step holds.

#include <cstdint>

namespace fsdp::memory {

enum class BufferKind { kGathered, kGradient, kComm };
constexpr int kBufferKinds = 3;

// delta_bytes may be negative (a release).
void count(BufferKind kind, int64_t delta_bytes);

int64_t current_bytes(BufferKind kind);
int64_t peak_bytes(BufferKind kind);
// All kinds together, now and at their most since the last reset.
int64_t current_total_bytes();
int64_t peak_total_bytes();
// Peaks restart from what is held now.
void reset_peaks();

// Counts `bytes` of `kind` for its own lifetime: attach one to whatever owns
// a buffer (a collective's finishing step, say) and the release is counted
// when the owner goes away.
class Reservation {
 public:
  Reservation(BufferKind kind, int64_t bytes) : kind_(kind), bytes_(bytes) { count(kind_, bytes_); }
  ~Reservation() { count(kind_, -bytes_); }
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;

 private:
  BufferKind kind_;
  int64_t bytes_;
};

}  // namespace fsdp::memory
