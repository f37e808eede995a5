// DIR/latest and DIR/best, the pointers to a directory's checkpoints, and
// the pruning that keeps the newest `keep` and the best.
#include "fsdp/checkpoint/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include "fsdp/common/error.h"
#include "fsdp/io/atomic_file.h"
#include "fsdp/io/input_file.h"
#include "fsdp/io/remove_tree.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

// The checkpoint DIR/POINTER names (`latest`, `best`). The pointer is a
// regular file or nothing: a FIFO would block the read forever, a folder
// names nothing (io::read_file refuses both by name).
std::optional<std::string> pointed_at(const std::string& dir, const std::string& pointer) {
  const std::string file = dir + "/" + pointer;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(file, ec))) return std::nullopt;
  const std::string text = io::read_file(file, "checkpoint pointer");
  const std::string name = text.substr(0, text.find('\n'));
  const std::string path = dir + "/" + name;
  FSDP_CHECK(!name.empty() && name.find('/') == std::string::npos && fs::is_directory(path), "'", dir, "/", pointer,
             "' names '", name, "', which is not a checkpoint directory");
  return path;
}

}  // namespace

std::optional<std::string> latest(const std::string& dir) { return pointed_at(dir, "latest"); }

std::optional<std::string> best(const std::string& dir) { return pointed_at(dir, "best"); }

void mark_best(const std::string& dir, const std::string& checkpoint, int keep) {
  const std::string name = fs::path(checkpoint).filename().string();
  FSDP_CHECK(fs::is_directory(dir + "/" + name), "best checkpoint '", checkpoint, "' is not a checkpoint of '", dir,
             "'");
  io::write_file_atomically(dir + "/best", name + "\n");
  detail::prune(dir, keep);  // the best before, kept only as the best, goes
}

namespace detail {

void prune(const std::string& dir, int keep) {
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step_", 0) == 0 && n.find(".tmp") == std::string::npos) steps.push_back(n);
  }
  std::sort(steps.begin(), steps.end());
  // The best checkpoint (DIR/best) stays, beside the newest `keep`.
  std::string kept_best;
  if (std::ifstream in(dir + "/best"); in.good()) std::getline(in, kept_best);
  steps.erase(std::remove(steps.begin(), steps.end(), kept_best), steps.end());
  for (size_t i = 0; keep > 0 && i + static_cast<size_t>(keep) < steps.size(); ++i)
    io::remove_tree(dir + "/" + steps[i]);
}

}  // namespace detail

}  // namespace fsdp::checkpoint
