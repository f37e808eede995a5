#include "fsdp/train/profile_window.h"

#include <torch/csrc/autograd/profiler_legacy.h>

#include <cstdlib>
#include <filesystem>

#include "fsdp/common/error.h"

namespace fsdp::train {

StepRange StepRange::parse(const std::string& text, const std::string& flag) {
  StepRange r;
  if (text.empty()) return r;
  const auto colon = text.find(':');
  const std::string a = text.substr(0, colon), b = colon == std::string::npos ? a : text.substr(colon + 1);
  char *end_a = nullptr, *end_b = nullptr;
  r.first = std::strtoll(a.c_str(), &end_a, 10);
  r.last = std::strtoll(b.c_str(), &end_b, 10);
  FSDP_CHECK(!a.empty() && !b.empty() && *end_a == '\0' && *end_b == '\0' && r.first >= 1 && r.last >= r.first, flag,
             " is '", text, "': expected A:B with 1 <= A <= B (steps, counting from 1)");
  return r;
}

ProfileWindow::ProfileWindow(StepRange range, std::string trace_path) : range_(range), path_(std::move(trace_path)) {}

ProfileWindow::~ProfileWindow() = default;

void ProfileWindow::step_begins(int64_t step) {
  if (range_.empty() || step + 1 != range_.first) return;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
  profile_ = std::make_unique<torch::autograd::profiler::RecordProfile>(path_);
}

void ProfileWindow::step_ends(int64_t step) {
  if (profile_ && step + 1 >= range_.last) profile_.reset();  // writes the trace
}

}  // namespace fsdp::train
