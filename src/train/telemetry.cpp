#include "fsdp/train/telemetry.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include <torch/torch.h>
#ifdef FSDP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

#include "fsdp/common/error.h"
#include "fsdp/train/tensorboard.h"

namespace fsdp::train {

namespace {

// A run's own files are appended to on resume: a symbolic link planted in
// the run folder would have them written wherever it points.
void refuse_symbolic_link(const std::string& path, const char* what) {
  std::error_code ec;
  FSDP_CHECK(!std::filesystem::is_symlink(path, ec), "the ", what, " '", path,
             "' is a symbolic link; a run writes its files only as files of its own (remove the link)");
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, const std::string& tensorboard_dir, bool append) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  refuse_symbolic_link(path, "metrics file");
  lock_ = std::make_unique<io::FileLock>(path, "--metrics");
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  FSDP_CHECK(out_.good(), "cannot write the metrics file '", path, "'");
  if (!tensorboard_dir.empty()) tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboard_dir);
}

MetricsLog::~MetricsLog() = default;

void MetricsLog::write(const nlohmann::json& line) {
  out_ << line.dump() << "\n";
  out_.flush();
  FSDP_CHECK(out_.good(), "cannot write the metrics file (disk full?)");
  // Events (start, checkpoint, resume) have no curve; steps' numbers do.
  if (!tensorboard_ || line.contains("event") || !line.contains("step")) return;
  const std::string prefix = line.value("split", "train") + "/";
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& [key, value] : line.items()) {
    if (key == "step" || !(value.is_number() || value.is_boolean())) continue;
    scalars.emplace_back(prefix + key, value.is_boolean() ? (value.get<bool>() ? 1.0 : 0.0) : value.get<double>());
  }
  tensorboard_->scalars(line.at("step").get<int64_t>(), scalars);
}

void MetricsLog::text(int64_t step, const std::string& tag, const std::string& markdown) {
  if (tensorboard_) tensorboard_->text(step, tag, markdown);
}

RunLog::RunLog(int rank)
    : rank_(rank), tty_(::isatty(STDOUT_FILENO) != 0), start_(std::chrono::steady_clock::now()) {}

void RunLog::open(const std::string& log_path, int64_t first_step, int64_t total_steps, const std::string& marker) {
  first_step_ = first_step;
  total_steps_ = total_steps;
  start_ = std::chrono::steady_clock::now();
  std::filesystem::create_directories(std::filesystem::path(log_path).parent_path());
  refuse_symbolic_link(log_path, "log file");
  log_.open(log_path, std::ios::app);
  FSDP_CHECK(log_.good(), "cannot write the log file '", log_path, "'");
  if (!marker.empty()) write_file(marker);
  for (const auto& line : held_) write_file(line);
  held_.clear();
}

void RunLog::write_file(const std::string& text) {
  if (!log_.is_open()) {
    held_.push_back(text);
    return;
  }
  log_ << text << "\n";
  log_.flush();
}

void RunLog::note(const std::string& text) { write_file(text); }

void RunLog::say(const std::string& text) {
  if (rank_ != 0) return;
  if (bar_drawn_) std::printf("\n");
  bar_drawn_ = false;
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
  write_file(text);
}

void RunLog::step(int64_t step, double loss, double tokens_per_s, double lr, double grad_norm, double seconds,
                  const std::string& extra) {
  if (rank_ != 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (eta_from_step_ < 0) {
    eta_from_step_ = step;
    eta_from_ = now;
  }
  // From the steps after the first one seen; until there is one, from that
  // step's own time (start-up excluded), marked as a guess.
  const int64_t left = total_steps_ - step - 1;
  const int64_t done = step - eta_from_step_;
  std::string eta;
  if (left == 0) {
    eta = "0s";
  } else if (done > 0) {
    eta = std::to_string(std::llround(std::chrono::duration<double>(now - eta_from_).count() /
                                      static_cast<double>(done) * static_cast<double>(left))) + "s";
  } else {
    eta = "~" + std::to_string(std::llround(seconds * static_cast<double>(left))) + "s";
  }
  char line[256];
  std::snprintf(line, sizeof(line), "step %lld/%lld  loss %.4f  lr %.2e  grad_norm %.3f  %.0f tok/s  ETA %s",
                static_cast<long long>(step + 1), static_cast<long long>(total_steps_), loss, lr, grad_norm,
                tokens_per_s, eta.c_str());
  const std::string text = extra.empty() ? std::string(line) : std::string(line) + "  " + extra;
  write_file(text);
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * static_cast<double>(step + 1) / static_cast<double>(total_steps_));
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::printf("\r[%s] step %lld/%lld  loss %.4f  %.0f tok/s  ETA %s   ", bar.c_str(),
                static_cast<long long>(step + 1), static_cast<long long>(total_steps_), loss, tokens_per_s,
                eta.c_str());
    bar_drawn_ = true;
  } else {
    std::printf("%s\n", text.c_str());
  }
  std::fflush(stdout);
}

void RunLog::finish() {
  if (bar_drawn_) std::printf("\n");
  bar_drawn_ = false;
  std::fflush(stdout);
}

namespace {

// A "Name:  N kB" line of /proc/self/status, in bytes; 0 if absent.
int64_t status_bytes(const std::string& name) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(name, 0) == 0) return std::stoll(line.substr(name.size())) * 1024;
  }
  return 0;
}

}  // namespace

int64_t peak_rss_bytes() { return status_bytes("VmHWM:"); }
int64_t rss_bytes() { return status_bytes("VmRSS:"); }

double measured_cpu_peak_flops(at::ScalarType dtype) {
  static std::mutex mutex;
  static std::map<at::ScalarType, double> peaks;
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = peaks.find(dtype); it != peaks.end()) return it->second;
  torch::NoGradGuard no_grad;
  const int64_t n = 1024;
  // A generator of its own: the global one belongs to the training run,
  // and a resumed run must draw exactly what an uninterrupted one does.
  at::Generator gen = at::detail::createCPUGenerator(0);
  auto a = at::randn({n, n}, gen).to(dtype);
  auto b = at::randn({n, n}, gen).to(dtype);
  auto c = a.matmul(b);  // warm up: thread pool, packing buffers
  c = a.matmul(b);
  // The best of several short bursts: interference (other ranks starting,
  // the OS) only ever slows a burst, so the best one is the stable figure.
  // One burst of 0.2 s at n = 512 gave 12.8e9 on one start and 69.3e9 on
  // another on the same machine.
  double best = 0;
  for (int burst = 0; burst < 5; ++burst) {
    int iters = 0;
    const auto start = std::chrono::steady_clock::now();
    double seconds = 0;
    while (seconds < 0.05) {
      c = a.matmul(b);
      ++iters;
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) * iters / seconds);
  }
  peaks[dtype] = best;
  return best;
}

double measured_peak_flops(at::ScalarType dtype, const at::Device& device) {
  if (!device.is_cuda()) return measured_cpu_peak_flops(dtype);
  torch::NoGradGuard no_grad;
  const int64_t n = 4096;
  at::Generator gen = at::detail::createCPUGenerator(0);  // not the run's generators
  auto a = at::randn({n, n}, gen).to(device, dtype);
  auto b = at::randn({n, n}, gen).to(device, dtype);
  auto c = a.matmul(b);
  torch::cuda::synchronize(device.index());
  double best = 0;
  for (int burst = 0; burst < 5; ++burst) {
    constexpr int kIters = 20;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kIters; ++i) c = a.matmul(b);
    torch::cuda::synchronize(device.index());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) * kIters / seconds);
  }
  return best;
}

int64_t peak_device_bytes(const at::Device& device) {
#ifdef FSDP_WITH_CUDA
  if (device.is_cuda()) {
    // Index 0 of each statistic is the aggregate over pool kinds, in every
    // LibTorch release the build supports (the type's name moved between them).
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[0].peak;
  }
#endif
  (void)device;
  return 0;
}

void start_device_memory_history(const at::Device& device, int64_t max_entries) {
  FSDP_CHECK(device.is_cuda(), "a GPU memory history needs a CUDA device, not ", device.str());
#ifdef FSDP_WITH_CUDA
  // Stacks "python": no interpreter runs here, so entries carry no frames,
  // and no C++ unwinding slows each allocation.
  torch::cuda::_record_memory_history(std::optional<std::string>("all"), std::optional<std::string>("all"), "python",
                                      static_cast<size_t>(max_entries));
#else
  (void)max_entries;
#endif
}

std::string stop_device_memory_history() {
#ifdef FSDP_WITH_CUDA
  std::string pickled = torch::cuda::_memory_snapshot_pickled();
  torch::cuda::_record_memory_history(std::nullopt);
  return pickled;
#else
  return {};
#endif
}

double training_flops_per_token(int64_t params, int64_t layers, int64_t seq_len, int64_t dim) {
  return 6.0 * static_cast<double>(params) + 12.0 * static_cast<double>(layers * seq_len * dim);
}

}  // namespace fsdp::train
