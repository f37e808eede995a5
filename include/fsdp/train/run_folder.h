#pragma once
// A run's folder: config.yaml, metrics.jsonl, tensorboard/, logs/rank<N>.log
// and (by default) checkpoints/. A fresh run never writes into another
// run's files: what an earlier run left there is moved aside first. Light
// header: no LibTorch.

#include <cstdint>
#include <string>

namespace fsdp::train {

struct RunFolder {
  std::string dir;
  std::string config() const { return dir + "/config.yaml"; }
  std::string metrics() const { return dir + "/metrics.jsonl"; }
  std::string tensorboard() const { return dir + "/tensorboard"; }
  std::string checkpoints() const { return dir + "/checkpoints"; }
  std::string log(int rank) const { return dir + "/logs/rank" + std::to_string(rank) + ".log"; }
  std::string trace(int rank) const { return dir + "/traces/rank" + std::to_string(rank) + ".json"; }
};

// "<model>-<YYYYmmdd>-<HHMMSS>" (UTC) for a run started at `unix_seconds`.
std::string default_run_name(const std::string& model, int64_t unix_seconds);

// Checks that `path` can be a directory we write into (creating it if
// needed) before any training starts; `flag` names the option in errors.
void check_writable_dir(const std::string& path, const std::string& flag);
// Checks that `path` can be created or replaced as a file.
void check_writable_file(const std::string& path, const std::string& flag);

// Moves the files an earlier, finished or abandoned run left in the folder
// (config.yaml, metrics.jsonl, tensorboard/, logs/, traces/) into
// DIR/earlier-<n>/. Returns that folder, or "" when there was nothing.
std::string set_aside_earlier_run(const RunFolder& folder);

}  // namespace fsdp::train
