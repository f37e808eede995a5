#pragma once
// What the trainer reports: one JSON object per line in the metrics file,
// and on a terminal a progress bar (plain lines when output is not a TTY).

#include <chrono>
#include <fstream>
#include <memory>
#include <string>

#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

namespace fsdp::train {

// Rank 0's metrics: one JSON object per line, and the same numbers as
// TensorBoard scalars (train/<key>, val/loss) when a TensorBoard directory
// is given.
class MetricsLog {
 public:
  // `append` continues a resumed run's file; otherwise the file starts
  // empty. Throws naming the path if it cannot be opened.
  MetricsLog(const std::string& path, const std::string& tensorboard_dir, bool append);
  ~MetricsLog();
  void write(const nlohmann::json& line);

 private:
  std::ofstream out_;
  std::unique_ptr<class TensorBoardWriter> tensorboard_;
};

class Progress {
 public:
  // Every line shown is also appended to `log_path` (this rank's log) when set.
  Progress(int64_t first_step, int64_t total_steps, const std::string& log_path = "");
  // One update per logged step; draws a bar on a terminal, prints a line otherwise.
  void log(int64_t step, double loss, double tokens_per_s, double lr, double grad_norm);
  void message(const std::string& text);
  void finish();
  // Written to the log file only (errors, the resume marker).
  void log_only(const std::string& text);

 private:
  bool tty_;
  std::ofstream log_;
  int64_t first_step_, total_steps_;
  std::chrono::steady_clock::time_point start_;
  bool bar_drawn_ = false;
};

// Peak resident memory of this process (VmHWM), in bytes.
int64_t peak_rss_bytes();

// The matmul rate this process reaches with its threads (FLOP/s) in
// `dtype` (the run's compute dtype: bf16 matmuls can run faster than fp32
// ones), measured once per dtype; the CPU "peak" MFU is stated against.
double measured_cpu_peak_flops(at::ScalarType dtype);

// Model FLOPs per token for training (forward + backward): 6 N + 12 L T C.
double training_flops_per_token(int64_t params, int64_t layers, int64_t seq_len, int64_t dim);

}  // namespace fsdp::train
