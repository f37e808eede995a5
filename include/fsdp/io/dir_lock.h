#pragma once
// One job per folder: an advisory lock (flock) on DIR/.lock, held for the
// lock object's life and released by the kernel when the process dies, so
// a `kill -9` never leaves a stale lock behind. The file names its holder
// (host, PID, start time) for the message a second job gets. Light header:
// no LibTorch.
//
// [Note: one job owns a run folder]
// Two runs writing one folder move each other's files aside, save into one
// checkpoints/ and prune each other's checkpoints. The trainer's rank 0
// takes this lock on the run folder (and on --ckpt-dir when that lies
// elsewhere) before anything is written, and holds it until the process
// ends; its job's other ranks write only after rank 0 has it (they wait on
// it at the next collective), so the job holds the lock as one. A
// restarted attempt (fsdp launch --max-restarts) starts after every rank of
// the failed one has exited, and takes the lock afresh. flock works across
// the nodes of NFSv4 and Lustre mounts (Linux maps it to their byte-range
// locks).

#include <string>
#include <vector>

namespace fsdp::io {

class DirLock {
 public:
  static constexpr const char* kFileName = ".lock";

  // Takes the lock on DIR/.lock (DIR must exist), or throws fsdp::Error:
  // "<what> 'DIR' is in use by another job (host H, PID P, since T); ...
  // choose another <flag>".
  DirLock(const std::string& dir, const std::string& what, const std::string& flag);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  // Removes the lock file and releases the lock: for a start that failed
  // in a folder it created, so that the folder can go too.
  void release_and_remove();

  // Who holds (or last held) the lock of DIR, as its file says: "host H,
  // PID P, since T"; empty when the file says nothing.
  static std::string holder(const std::string& dir);

  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::string path_;
  int fd_ = -1;
};

// One job per file, for a file a job appends to outside any folder it
// locks (--metrics): an exclusive flock on the file itself, held for the
// object's life. Opens (creating it where absent, never through a
// symbolic link) and locks, or throws fsdp::Error: "<flag> '<path>' is
// being written by another live job; ...".
class FileLock {
 public:
  FileLock(const std::string& path, const std::string& flag);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// The nearest folder holding PATH (PATH itself when it is a folder) whose
// lock a live job holds: a run folder or checkpoint folder of another job,
// where this one must not write. Folders in `own` (the locks this process
// holds) are passed over. Empty when there is none.
std::string folder_of_a_live_job(const std::string& path, const std::vector<std::string>& own);

// Throws fsdp::Error when PATH (an output named by `flag`) lies in a live
// job's folder (folder_of_a_live_job): "<flag> 'PATH' lies in 'DIR', the
// folder of another live job (host H, PID P, ...); ...". `fsdp train`'s
// outputs and `fsdp ckpt export`'s are checked alike.
void refuse_a_live_jobs_folder(const std::string& path, const std::string& flag,
                               const std::vector<std::string>& own = {});

}  // namespace fsdp::io
