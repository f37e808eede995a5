#include "fsdp/train/run_folder.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <vector>

#include "fsdp/common/error.h"
#include "fsdp/io/remove_tree.h"

namespace fsdp::train {
namespace fs = std::filesystem;

std::string default_run_name(const std::string& model, int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
  std::string name = model.empty() ? "run" : model;
  for (char& c : name) {
    if (c == '/' || c == ' ') c = '_';
  }
  return name + "-" + stamp;
}

RunPaths resolve_run_paths(TrainConfig& config, int64_t started_unix_seconds) {
  auto& r = config.runtime;
  if (r.out_dir.empty()) {
    if (r.run_name.empty()) {
      const std::string model =
          !config.model.init_from.empty() ? fs::path(config.model.init_from).filename().string() : config.model.name;
      r.run_name = default_run_name(model, started_unix_seconds);
    }
    r.out_dir = "out/" + r.run_name;
  }
  RunPaths paths;
  paths.folder.dir = r.out_dir;
  paths.folder_existed = fs::exists(r.out_dir);
  paths.metrics_derived = config.logging.metrics.empty();
  if (paths.metrics_derived) config.logging.metrics = paths.folder.metrics();
  auto& c = config.checkpoint;
  const bool asked = !c.dir.empty() || c.save_every > 0 || config.eval.keep_best;
  if (c.dir.empty() && (asked || fs::exists(paths.folder.checkpoints() + "/latest"))) {
    c.dir = paths.folder.checkpoints();
    paths.ckpt_dir_derived = true;
  }
  paths.run_root_created = first_missing_ancestor(r.out_dir);
  if (!c.dir.empty()) paths.ckpt_root_created = first_missing_ancestor(c.dir);
  if (!config.hf_export.dir.empty()) paths.export_root_created = first_missing_ancestor(config.hf_export.dir);
  return paths;
}

void check_output_paths(const TrainConfig& config, const RunFolder& folder, bool all) {
  check_writable_dir(folder.dir, "--out-dir");
  if (!all) return;
  check_writable_file(config.logging.metrics, "--metrics");
  if (!config.checkpoint.dir.empty()) check_writable_dir(config.checkpoint.dir, "--ckpt-dir");
  const std::string& hf = config.hf_export.dir;
  if (!hf.empty()) {
    check_writable_dir(hf, "--export-hf");
    for (const char* f : {"config.json", "model.safetensors"}) check_writable_file(hf + "/" + f, "--export-hf");
  }
}

TrainConfig recorded_config(const TrainConfig& config, const RunPaths& paths) {
  TrainConfig recorded = config;
  recorded.runtime.out_dir.clear();
  recorded.runtime.run_name.clear();
  // Where this run started from is no setting of the next one.
  recorded.checkpoint.resume = false;
  recorded.checkpoint.resume_from = 0;
  if (paths.metrics_derived) recorded.logging.metrics.clear();
  if (paths.ckpt_dir_derived) recorded.checkpoint.dir.clear();
  return recorded;
}

std::string first_missing_ancestor(const std::string& path) {
  std::error_code ec;
  std::string missing;
  for (fs::path p = fs::absolute(path, ec).lexically_normal(); !p.empty() && !fs::exists(p, ec);
       p = p.parent_path()) {
    missing = p.string();
    if (p == p.parent_path()) break;
  }
  return missing;
}

void remove_if_holds_no_file(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_directory()) return;
  }
  if (!ec) io::remove_tree(dir, ec);
}

void check_writable_dir(const std::string& path, const std::string& flag) {
  std::error_code ec;
  FSDP_CHECK(!fs::exists(path, ec) || fs::is_directory(path, ec), flag, " '", path,
             "' is a file; expected a directory (or a path to create one at)");
  fs::create_directories(path, ec);
  FSDP_CHECK(!ec, flag, " '", path, "': cannot create the directory (", ec.message(), ")");
  FSDP_CHECK(::access(path.c_str(), W_OK | X_OK) == 0, flag, " '", path, "': the directory is not writable (",
             std::strerror(errno), ")");
}

void check_writable_file(const std::string& path, const std::string& flag) {
  std::error_code ec;
  FSDP_CHECK(!fs::is_directory(path, ec), flag, " '", path, "' is a directory; expected a file");
  const auto parent = fs::path(path).parent_path();
  check_writable_dir(parent.empty() ? "." : parent.string(), flag + " (its directory)");
}

namespace {
// What a run writes in its folder, besides checkpoints/.
const char* const kRunEntries[] = {"config.yaml", "metrics.jsonl", "tensorboard", "logs", "traces", "memory"};
}  // namespace

void refuse_symbolic_link(const std::string& path) {
  std::error_code ec;
  FSDP_CHECK(!fs::is_symlink(fs::symlink_status(path, ec)), "'", path,
             "' is a symbolic link; a run writes its files only as files and folders of its own, under its folder "
             "(remove the link; --ckpt-dir and --metrics name places elsewhere)");
}

void refuse_symbolic_links(const RunFolder& folder) {
  std::error_code ec;
  for (const char* e : kRunEntries) {
    const fs::path path = fs::path(folder.dir) / e;
    refuse_symbolic_link(path.string());
    if (!fs::is_directory(fs::symlink_status(path, ec))) continue;
    for (const auto& entry : fs::directory_iterator(path, ec)) refuse_symbolic_link(entry.path().string());
  }
}

std::string set_aside_earlier_run(const RunFolder& folder) {
  const auto& entries = kRunEntries;
  bool any = false;
  for (const char* e : entries) any = any || fs::exists(fs::path(folder.dir) / e);
  if (!any) return "";
  int n = 1;
  while (fs::exists(fs::path(folder.dir) / ("earlier-" + std::to_string(n)))) ++n;
  const fs::path aside = fs::path(folder.dir) / ("earlier-" + std::to_string(n));
  fs::create_directories(aside);
  for (const char* e : entries) {
    const fs::path from = fs::path(folder.dir) / e;
    if (fs::exists(from)) fs::rename(from, aside / e);
  }
  return aside.string();
}

}  // namespace fsdp::train
