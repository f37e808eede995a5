#pragma once
// `--profile-steps A:B`: LibTorch's profiler over steps A..B (1-based,
// inclusive), written as one Chrome trace per rank (chrome://tracing,
// Perfetto), its process named after the rank. The FSDP core marks its
// phases with record-function ranges (FSDP::all_gather,
// FSDP::reduce_scatter, FSDP::pre_forward, ...), so they appear in the
// trace beside the operators. LibTorch 2.x records through Kineto, 1.13
// through its legacy profiler.

#include <memory>
#include <string>

namespace fsdp::train {

struct StepRange {
  int64_t first = 0, last = -1;  // 1-based, inclusive; empty when last < first
  // Parses "A:B" (or "A" for one step). Throws naming `flag`.
  static StepRange parse(const std::string& text, const std::string& flag);
  bool empty() const { return last < first; }
};

class ProfileWindow {
 public:
  // `process_name` ("rank 0") names the trace's process.
  ProfileWindow(StepRange range, std::string trace_path, std::string process_name);
  ~ProfileWindow();                // a run stopped inside the window still writes its trace
  void step_begins(int64_t step);  // 0-based, as the trainer counts
  // True when this step closed the window (its last step, or the run's)
  // and the trace was written.
  bool step_ends(int64_t step, bool run_ends);
  const std::string& path() const { return path_; }
  const StepRange& range() const { return range_; }

 private:
  StepRange range_;
  std::string path_;
  std::string process_name_;
  void finish();  // stops the recording, if any, and writes the named trace
  struct Recording;  // the running profiler, per LibTorch version
  std::unique_ptr<Recording> recording_;
};

}  // namespace fsdp::train
