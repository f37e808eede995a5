#include "fsdp/io/memory_snapshot.h"

#include "fsdp/io/atomic_file.h"
#include "fsdp/io/pickle_writer.h"

namespace fsdp::memory {
namespace {

void frames(io::PickleWriter& w, const std::string& phase) {
  w.begin_list();
  w.begin_dict();
  w.value("filename");
  w.value("fsdp.cpp");
  w.value("line");
  w.value(int64_t{0});
  w.value("name");
  w.value(phase);
  w.end_dict();
  w.end_list();
}

void segment(io::PickleWriter& w, const LiveBlock& b, const std::string& phase) {
  w.begin_dict();
  for (const char* key : {"address", "total_size", "allocated_size", "active_size", "requested_size"}) {
    w.value(key);
    w.value(key[0] == 'a' && key[1] == 'd' ? static_cast<int64_t>(b.addr) : b.size);
  }
  w.value("device");
  w.value(int64_t{0});
  w.value("stream");
  w.value(int64_t{0});
  w.value("segment_type");
  w.value("large");
  w.value("frames");
  frames(w, phase);
  w.value("blocks");
  w.begin_list();
  w.begin_dict();
  w.value("address");
  w.value(static_cast<int64_t>(b.addr));
  w.value("size");
  w.value(b.size);
  w.value("requested_size");
  w.value(b.size);
  w.value("state");
  w.value("active_allocated");
  w.value("frames");
  frames(w, phase);
  w.end_dict();
  w.end_list();
  w.end_dict();
}

void trace_entry(io::PickleWriter& w, const AllocationEvent& e, const char* action, const std::string& phase) {
  w.begin_dict();
  w.value("action");
  w.value(action);
  w.value("addr");
  w.value(static_cast<int64_t>(e.addr));
  w.value("size");
  w.value(e.size > 0 ? e.size : -e.size);
  w.value("stream");
  w.value(int64_t{0});
  w.value("time_us");
  w.value(e.time_us);
  w.value("frames");
  frames(w, phase);
  w.end_dict();
}

}  // namespace

std::string memory_snapshot_pickle(const Recording& r, int rank) {
  const auto phase = [&](int32_t id) -> const std::string& { return r.phases.at(static_cast<size_t>(id)); };
  io::PickleWriter w;
  w.begin_dict();
  w.value("segments");
  w.begin_list();
  for (const auto& b : r.live_at_end) segment(w, b, phase(b.phase));
  w.end_list();
  w.value("device_traces");
  w.begin_list();
  w.begin_list();
  // The CPU allocator's block is its own segment: each allocation maps one
  // (segment_alloc, then alloc) and each free unmaps it (free_completed,
  // then segment_free), so the viewer's segment views follow them.
  for (const auto& e : r.events) {
    if (e.size > 0) {
      trace_entry(w, e, "segment_alloc", phase(e.phase));
      trace_entry(w, e, "alloc", phase(e.phase));
    } else {
      trace_entry(w, e, "free_completed", phase(e.phase));
      trace_entry(w, e, "segment_free", phase(e.phase));
    }
  }
  w.end_list();
  w.end_list();
  // What this file is, for readers that look: a CPU rank's recording.
  w.value("fsdp_cpp");
  w.begin_dict();
  w.value("device");
  w.value("cpu");
  w.value("rank");
  w.value(static_cast<int64_t>(rank));
  w.value("bytes_at_start");
  w.value(r.bytes_at_start);
  w.value("peak_bytes");
  w.value(r.peak_bytes);
  w.value("peak_phase");
  w.value(r.peak_event >= 0 ? phase(r.events[static_cast<size_t>(r.peak_event)].phase) : std::string("start"));
  w.end_dict();
  w.end_dict();
  return w.finish();
}

void write_memory_snapshot(const Recording& recording, int rank, const std::string& path) {
  io::write_file_atomically(path, memory_snapshot_pickle(recording, rank));
}

}  // namespace fsdp::memory
