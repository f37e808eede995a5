#pragma once
// What the trainer reports: one JSON object per line in the metrics file,
// the console (a progress bar on a terminal, plain lines otherwise) and
// each rank's log file.

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include "fsdp/io/dir_lock.h"

namespace fsdp::train {

// Rank 0's metrics: one JSON object per line, and the same numbers as
// TensorBoard scalars (train/<key>, val/loss) when a TensorBoard directory
// is given.
class MetricsLog {
 public:
  // `append` continues a resumed run's file; otherwise the file starts
  // empty. The file is this job's while the object lives (io::FileLock):
  // throws naming the path if another live job holds it, or if it cannot
  // be opened.
  MetricsLog(const std::string& path, const std::string& tensorboard_dir, bool append);
  ~MetricsLog();
  void write(const nlohmann::json& line);
  // Text for TensorBoard's Text tab (validation samples), when it is on.
  void text(int64_t step, const std::string& tag, const std::string& markdown);

 private:
  std::unique_ptr<io::FileLock> lock_;
  std::ofstream out_;
  std::unique_ptr<class TensorBoardWriter> tensorboard_;
};

// The run's console and log files: rank 0 speaks (`say`), every rank keeps
// its own log (`note`), so no caller asks which rank it is. Lines from
// before the run folder exists (the model, the data, a resume's
// configuration difference) are held and written when the log opens:
// logs/rank<N>.log tells the whole start. Output is flushed per line, so
// lines arrive in order through a launcher's pipes.
class RunLog {
 public:
  explicit RunLog(int rank);
  // Appends to `log_path` from now on: `marker` (when not empty), then the
  // held lines.
  void open(const std::string& log_path, int64_t first_step, int64_t total_steps, const std::string& marker = "");
  // Rank 0: printed and logged. Other ranks: nothing.
  void say(const std::string& text);
  void warn(const std::string& text) { say("warning: " + text); }
  // This rank's log file only (errors, the resume marker, its own traces).
  void note(const std::string& text);
  // Rank 0: one update per logged step; a bar on a terminal, a line otherwise.
  // `seconds`: this step's own time, the ETA's first guess; `extra`, the
  // objective's own figures, ends the logged line.
  void step(int64_t step, double loss, double tokens_per_s, double lr, double grad_norm, double seconds,
            const std::string& extra = "");
  // Ends the bar's line.
  void finish();
  bool speaks() const { return rank_ == 0; }

 private:
  void write_file(const std::string& text);

  int rank_;
  bool tty_;
  std::ofstream log_;
  std::vector<std::string> held_;  // noted before the log file opened
  int64_t first_step_ = 0, total_steps_ = 0;
  std::chrono::steady_clock::time_point start_;
  // The first step seen and when it ended: the ETA counts from there, since
  // the first step carries start-up work (allocations, caches) the others do not.
  int64_t eta_from_step_ = -1;
  std::chrono::steady_clock::time_point eta_from_;
  bool bar_drawn_ = false;
};

// Peak resident memory of this process (VmHWM), in bytes.
int64_t peak_rss_bytes();
// Resident memory now.
int64_t rss_bytes();

// The matmul rate this process reaches with its threads (FLOP/s) in
// `dtype` (the run's compute dtype: bf16 matmuls can run faster than fp32
// ones), measured once per dtype; the CPU "peak" MFU is stated against.
double measured_cpu_peak_flops(at::ScalarType dtype);
// The same on a GPU: the best rate of 4096^2 products in `dtype` on
// `device` (TF32 as the run has it for fp32); the CPU's figure for a CPU.
double measured_peak_flops(at::ScalarType dtype, const at::Device& device);
// The peak of tensor memory the CUDA caching allocator handed out on
// `device` since the process started, in bytes; 0 for a CPU or a CPU build.
int64_t peak_device_bytes(const at::Device& device);

// The CUDA caching allocator's history, as torch.cuda.memory's
// _record_memory_history and _dump_snapshot keep it: start records every
// allocation and free on the GPU (at most `max_entries`, the oldest dropped
// first); stop returns the snapshot in _dump_snapshot's pickle, which
// PyTorch's viewer and `torch.cuda._memory_viz` read, and ends the
// recording. Only on a GPU of a CUDA build: elsewhere start throws.
void start_device_memory_history(const at::Device& device, int64_t max_entries);
std::string stop_device_memory_history();

// Model FLOPs per token for training (forward + backward): 6 N + 12 L T C.
double training_flops_per_token(int64_t params, int64_t layers, int64_t seq_len, int64_t dim);

}  // namespace fsdp::train
