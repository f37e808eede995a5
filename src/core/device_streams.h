#pragma once
// The device seam of one module tree's collectives: a stream per kind of
// transfer (all-gather, reduce-scatter, replica all-reduce, and the
// offload's copies each way), ordered by events as FSDP2 orders its
// streams ([Note: streams] in device_streams.cpp). On the CPU there are
// none and every scope is a no-op. A leaf: c10's device-generic streams
// and events only, no CUDA header.

#include <functional>
#include <memory>
#include <optional>

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

namespace fsdp {

class DeviceStreams {
 public:
  enum class Stream { kAllGather, kReduceScatter, kAllReduce, kHostToDevice, kDeviceToHost };
  static constexpr int kStreams = 5;
  // Runs what it encloses on this tree's stream of that kind on `device`,
  // ordered after the work issued so far on the stream current at entry
  // (an event recorded there, waited on by the stream). No-op on the CPU,
  // where Gloo's own threads run the collectives and copies are
  // synchronous.
  class StreamScope {
   public:
    StreamScope(DeviceStreams& streams, Stream stream, const c10::Device& device);
    StreamScope(const StreamScope&) = delete;
    StreamScope& operator=(const StreamScope&) = delete;
    bool on_device() const { return guard_.has_value(); }

   private:
    std::optional<c10::StreamGuard> guard_;
  };
  // The stream current on `device` (inside a scope: the scope's).
  static c10::Stream current_stream(const c10::Device& device);
  // An event recorded on `stream` now (a GPU only), for another stream to
  // wait on later.
  std::shared_ptr<c10::Event> mark(Stream stream, const c10::Device& device);
  // The host waits for what was issued on `stream` so far: device-to-host
  // copies land before the host reads them (no-op where it was never used).
  void synchronize(Stream stream);
  // The same as a function for another thread (a no-op where the stream was
  // never used).
  std::function<void()> host_waiter(Stream stream) const;

 private:
  // Made at first use, on the first device a scope names (one per process).
  c10::Stream stream(Stream kind, const c10::Device& device);
  std::optional<c10::Stream> streams_[kStreams];
};

}  // namespace fsdp
