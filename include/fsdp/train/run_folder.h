#pragma once
// A run's folder: config.yaml, metrics.jsonl, tensorboard/, logs/rank<N>.log
// and (by default) checkpoints/. A fresh run never writes into another
// run's files: what an earlier run left there is moved aside first. Light
// header: no LibTorch.

#include <cstdint>
#include <string>

#include "fsdp/train/config.h"

namespace fsdp::train {

struct RunFolder {
  std::string dir;
  std::string config() const { return dir + "/config.yaml"; }
  std::string metrics() const { return dir + "/metrics.jsonl"; }
  std::string tensorboard() const { return dir + "/tensorboard"; }
  std::string checkpoints() const { return dir + "/checkpoints"; }
  std::string log(int rank) const { return dir + "/logs/rank" + std::to_string(rank) + ".log"; }
  std::string trace(int rank) const { return dir + "/traces/rank" + std::to_string(rank) + ".json"; }
  std::string memory_snapshot(int rank) const { return dir + "/memory/rank" + std::to_string(rank) + ".pickle"; }
};

// Where a run writes, decided once. `config` is completed in place:
// runtime.out_dir (out/<run_name>, the name from the model and
// `started_unix_seconds` when not given), logging.metrics and
// checkpoint.dir, derived from the folder when not given. Checkpoints are
// written when asked for (a directory, or a cadence); a folder that already
// holds some (a run saved here before) continues them.
struct RunPaths {
  RunFolder folder;
  bool folder_existed = false;     // the folder was there before this start
  bool metrics_derived = false;    // logging.metrics came from the folder
  bool ckpt_dir_derived = false;   // checkpoint.dir came from the folder
  // The topmost folder each output path would create (out/ for
  // out/<run>, when out/ is missing; "" where the path exists): what a
  // start that fails, or a stop before the export, removes again when it
  // holds no file.
  std::string run_root_created, ckpt_root_created, export_root_created;
};
RunPaths resolve_run_paths(TrainConfig& config, int64_t started_unix_seconds);

// Fails, naming the flag, when an output path cannot be written: a run must
// not train for hours and then find it cannot write its result. `all`:
// every path (one rank checks them), else the run folder only.
void check_output_paths(const TrainConfig& config, const RunFolder& folder, bool all);

// The configuration as config.yaml records it. config.yaml is reused
// (--config run1/config.yaml) and copied with its folder: paths that name
// the folder, or were derived from it, are left out, so a reuse writes
// where its own flags say and never into this run. Paths the user gave
// (--metrics, --ckpt-dir, --export-hf) stay; --resume and --resume-from,
// which say where this run started, do not.
TrainConfig recorded_config(const TrainConfig& config, const RunPaths& paths);

// The topmost ancestor of `path` (itself included) that does not exist; ""
// when `path` exists.
std::string first_missing_ancestor(const std::string& path);

// Removes `dir` when it holds no file (a start that failed before writing
// anything leaves no empty run folder behind).
void remove_if_holds_no_file(const std::string& dir);

// "<model>-<YYYYmmdd>-<HHMMSS>" (UTC) for a run started at `unix_seconds`.
std::string default_run_name(const std::string& model, int64_t unix_seconds);

// Checks that `path` can be a directory we write into (creating it if
// needed) before any training starts; `flag` names the option in errors.
void check_writable_dir(const std::string& path, const std::string& flag);
// Checks that `path` can be created or replaced as a file.
void check_writable_file(const std::string& path, const std::string& flag);

// Moves the files an earlier, finished or abandoned run left in the folder
// (config.yaml, metrics.jsonl, tensorboard/, logs/, traces/, memory/) into
// DIR/earlier-<n>/. Returns that folder, or "" when there was nothing.
std::string set_aside_earlier_run(const RunFolder& folder);

// Throws naming the first of the run folder's files and folders (config,
// metrics, logs, TensorBoard events, traces, memory snapshots, and what
// those folders hold) that is a symbolic link: a run appends to its files
// on resume, and a planted link would have them written wherever it points.
void refuse_symbolic_links(const RunFolder& folder);
// The same for one path (the run folder's checkpoints/, before its lock).
void refuse_symbolic_link(const std::string& path);

}  // namespace fsdp::train
