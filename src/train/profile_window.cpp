#include "fsdp/train/profile_window.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "fsdp/common/compat.h"
#include "fsdp/common/error.h"
#include "fsdp/io/atomic_file.h"

#include <torch/cuda.h>

// LibTorch 2.x profiles through Kineto (its legacy profiler is deprecated);
// Debian's 1.13 is built without Kineto, so it keeps the legacy one.
#if FSDP_TORCH_VERSION >= 200
#include <torch/csrc/autograd/profiler_kineto.h>
#else
#include <torch/csrc/autograd/profiler_legacy.h>
#endif

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

namespace {

// Names the trace's process (Chrome trace metadata events), so that traces
// of several ranks opened together say which rank is which.
void name_trace_process(const std::string& path, const std::string& process_name) {
  nlohmann::json trace;
  {
    std::ifstream in(path);
    if (!in) return;
    trace = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  if (trace.is_discarded()) return;
  nlohmann::json& events = trace.is_array() ? trace : trace["traceEvents"];
  if (!events.is_array()) return;
  std::set<int64_t> pids;
  for (auto it = events.begin(); it != events.end();) {
    if (it->is_object() && it->contains("pid") && (*it)["pid"].is_number_integer()) pids.insert((*it)["pid"].get<int64_t>());
    const bool names_process = it->is_object() && it->value("ph", "") == "M" && it->value("name", "") == "process_name";
    it = names_process ? events.erase(it) : std::next(it);
  }
  for (const int64_t pid : pids) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0},
                      {"args", {{"name", process_name}}}});
  }
  io::write_file_atomically(path, trace.dump());
}

}  // namespace

#if FSDP_TORCH_VERSION >= 200
struct ProfileWindow::Recording {
  explicit Recording(std::string path) : path_(std::move(path)) {
    namespace prof = torch::autograd::profiler;
    const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
    std::set<torch::profiler::impl::ActivityType> activities{torch::profiler::impl::ActivityType::CPU};
    // Kernels and copies on the GPU's streams, beside the host's calls: the
    // view that shows whether collectives overlap compute.
    if (torch::cuda::is_available()) activities.insert(torch::profiler::impl::ActivityType::CUDA);
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
  }
  ~Recording() {
    auto result = torch::autograd::profiler::disableProfiler();
    if (result) result->save(path_);
  }
  std::string path_;
};
#else
struct ProfileWindow::Recording {
  explicit Recording(const std::string& path) : profile(path) {}
  torch::autograd::profiler::RecordProfile profile;  // writes the trace when destroyed
};
#endif

ProfileWindow::ProfileWindow(StepRange range, std::string trace_path, std::string process_name)
    : range_(range), path_(std::move(trace_path)), process_name_(std::move(process_name)) {}

ProfileWindow::~ProfileWindow() { finish(); }

void ProfileWindow::finish() {
  if (!recording_) return;
  recording_.reset();  // writes the trace
  name_trace_process(path_, process_name_);
}

void ProfileWindow::step_begins(int64_t step) {
  // A run resumed inside the window records from its first step on.
  if (range_.empty() || recording_ || step + 1 < range_.first || step + 1 > range_.last) return;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
  recording_ = std::make_unique<Recording>(path_);
}

bool ProfileWindow::step_ends(int64_t step, bool run_ends) {
  if (!recording_ || (step + 1 < range_.last && !run_ends)) return false;
  finish();
  return true;
}

}  // namespace fsdp::train
