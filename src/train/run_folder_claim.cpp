#include "fsdp/train/run_folder_claim.h"

#include <filesystem>
#include <utility>

#include "fsdp/common/error.h"

namespace fsdp::train {

RunFolderClaim::RunFolderClaim() : undo_on_signal_(std::make_unique<io::UndoOnSignal>()) {}

int RunFolderClaim::lock_run_folder(const RunPaths& paths, bool may_rename, bool& made_it) {
  for (int suffix = 1;; ++suffix) {
    const std::string dir = suffix == 1 ? paths.folder.dir : paths.folder.dir + "-" + std::to_string(suffix);
    made_it = !std::filesystem::exists(dir);
    if (undo_on_signal_) {
      undo_on_signal_->remove_empty_dirs(dir, suffix == 1 ? paths.run_root_created : made_it ? dir : "");
    }
    check_writable_dir(dir, "--out-dir");
    try {
      locks_.push_back(std::make_unique<io::DirLock>(dir, "run folder", "--out-dir"));
      if (undo_on_signal_) undo_on_signal_->remove_file(dir + "/" + io::DirLock::kFileName);
      return suffix;
    } catch (const Error&) {
      if (made_it) remove_if_holds_no_file(dir);
      if (!may_rename || suffix >= 100) throw;
    }
  }
}

void RunFolderClaim::remove_created_folders_on_signal(const RunPaths& paths, const TrainConfig& config) {
  if (!undo_on_signal_) return;
  undo_on_signal_->remove_empty_dirs(paths.folder.dir, paths.run_root_created);
  undo_on_signal_->remove_empty_dirs(config.checkpoint.dir, paths.ckpt_root_created);
  undo_on_signal_->remove_empty_dirs(config.hf_export.dir, paths.export_root_created);
}

void RunFolderClaim::lock_checkpoint_folder(const std::string& ckpt_dir, const RunFolder& folder) {
  namespace fs = std::filesystem;
  // Checkpoints have a lock of their own: another run may name this run's
  // checkpoints/ as its --ckpt-dir from a folder of its own.
  if (ckpt_dir.empty() || fs::weakly_canonical(ckpt_dir) == fs::weakly_canonical(folder.dir)) return;
  check_writable_dir(ckpt_dir, "--ckpt-dir");
  locks_.push_back(std::make_unique<io::DirLock>(ckpt_dir, "checkpoint folder", "--ckpt-dir"));
  if (undo_on_signal_) undo_on_signal_->remove_file(ckpt_dir + "/" + io::DirLock::kFileName);
}

void RunFolderClaim::refuse_other_jobs_folders(const RunPaths& paths, const TrainConfig& config) const {
  std::vector<std::string> own;
  for (const auto& lock : locks_) own.push_back(lock->dir());
  const std::pair<const std::string*, const char*> outputs[] = {{&paths.folder.dir, "--out-dir"},
                                                                 {&config.checkpoint.dir, "--ckpt-dir"},
                                                                 {&config.logging.metrics, "--metrics"},
                                                                 {&config.hf_export.dir, "--export-hf"}};
  for (const auto& [path, flag] : outputs) io::refuse_a_live_jobs_folder(*path, flag, own);
}

void RunFolderClaim::keep() { undo_on_signal_.reset(); }

void RunFolderClaim::undo(const RunPaths& paths) {
  for (auto& lock : locks_) lock->release_and_remove();
  for (const auto* made : {&paths.run_root_created, &paths.ckpt_root_created, &paths.export_root_created}) {
    remove_if_holds_no_file(*made);
  }
  undo_on_signal_.reset();
}

}  // namespace fsdp::train
