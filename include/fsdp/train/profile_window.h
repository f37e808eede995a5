#pragma once
// `--profile-steps A:B`: LibTorch's profiler over steps A..B (1-based,
// inclusive), written as one Chrome trace per rank (chrome://tracing,
// Perfetto). The FSDP core marks its phases with record-function ranges
// (FSDP::all_gather, FSDP::reduce_scatter, FSDP::pre_forward, ...), so they
// appear in the trace beside the operators.

#include <memory>
#include <string>

namespace torch::autograd::profiler {
struct RecordProfile;
}

namespace fsdp::train {

struct StepRange {
  int64_t first = 0, last = -1;  // 1-based, inclusive; empty when last < first
  // Parses "A:B" (or "A" for one step). Throws naming `flag`.
  static StepRange parse(const std::string& text, const std::string& flag);
  bool empty() const { return last < first; }
};

class ProfileWindow {
 public:
  ProfileWindow(StepRange range, std::string trace_path);
  ~ProfileWindow();                // a run stopped inside the window still writes its trace
  void step_begins(int64_t step);  // 0-based, as the trainer counts
  void step_ends(int64_t step);
  const std::string& path() const { return path_; }

 private:
  StepRange range_;
  std::string path_;
  std::unique_ptr<torch::autograd::profiler::RecordProfile> profile_;
};

}  // namespace fsdp::train
