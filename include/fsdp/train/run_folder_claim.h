#pragma once
// Rank 0's claim on the folders a run writes ([Note: one job owns a run
// folder]): the lock of the run folder, and of --ckpt-dir where it lies
// elsewhere, held for the claim's life; and, while the start is under way,
// the undoing of what the start made (its locks, and the run, --ckpt-dir
// and --export-hf folders it created), when the start fails or SIGTERM or
// SIGINT stops it. Light header: no LibTorch.

#include <memory>
#include <string>
#include <vector>

#include "fsdp/io/dir_lock.h"
#include "fsdp/io/undo_on_signal.h"
#include "fsdp/train/config.h"
#include "fsdp/train/run_folder.h"

namespace fsdp::train {

class RunFolderClaim {
 public:
  // The start begins: from here until keep() or undo(), a stop signal
  // removes what the start made (io::UndoOnSignal).
  RunFolderClaim();
  RunFolderClaim(const RunFolderClaim&) = delete;
  RunFolderClaim& operator=(const RunFolderClaim&) = delete;

  // The run folder's lock, under the next free suffix where `may_rename`
  // (returns it: 1 for none; `made_it`: this start made the folder).
  int lock_run_folder(const RunPaths& paths, bool may_rename, bool& made_it);
  // Before the run folder, --ckpt-dir and --export-hf are created: what
  // the start creates of them goes again on a stop signal, if still empty.
  void remove_created_folders_on_signal(const RunPaths& paths, const TrainConfig& config);
  // --ckpt-dir's lock, where it is not the run folder.
  void lock_checkpoint_folder(const std::string& ckpt_dir, const RunFolder& folder);
  // Throws when an output path lies in the folder of another live job.
  void refuse_other_jobs_folders(const RunPaths& paths, const TrainConfig& config) const;

  // The start succeeded: a stop signal undoes nothing from here on. The
  // locks stay held for the claim's life.
  void keep();
  // The start failed: the locks released and their files removed, and the
  // folders the start created removed where they hold no file.
  void undo(const RunPaths& paths);

 private:
  // The run folder's, and --ckpt-dir's where it lies elsewhere.
  std::vector<std::unique_ptr<io::DirLock>> locks_;
  // While the start is under way: what a stop signal then removes (the
  // folders this start made, and their locks).
  std::unique_ptr<io::UndoOnSignal> undo_on_signal_;
};

}  // namespace fsdp::train
