#pragma once
// What a start has made, undone when SIGTERM or SIGINT ends it before it
// is done. While an UndoOnSignal lives, either signal first removes the
// files and the empty directories registered with it, then ends the
// process as the signal would have (a launcher or shell sees the same
// status). The handler makes only async-signal-safe calls (unlink, rmdir)
// on paths kept in fixed buffers; a directory that holds anything stays.
// Light header: no LibTorch.
//
// The trainer's rank 0 arms one for its set-up. A launcher stops a job
// whose other rank failed at start-up with SIGTERM, and a user stops a slow
// start with Ctrl-C: either way the run folder, --ckpt-dir and --export-hf
// folders the start created go, with their locks, as when the start fails
// by an error ([Note: one job owns a run folder]).

#include <signal.h>

#include <string>

namespace fsdp::io {

class UndoOnSignal {
 public:
  // Installs the handlers; one UndoOnSignal may live at a time.
  UndoOnSignal();
  // Restores the handlers that were there before.
  ~UndoOnSignal();
  UndoOnSignal(const UndoOnSignal&) = delete;
  UndoOnSignal& operator=(const UndoOnSignal&) = delete;

  // The file at `path` goes: a lock file this process holds, say.
  void remove_file(const std::string& path);
  // `dir` and its parents up to and including `top` go, each only if empty:
  // the directories a start created, `top` the first of them that was
  // missing. Nothing when `top` is empty (nothing was missing) or does not
  // contain `dir`.
  void remove_empty_dirs(const std::string& dir, const std::string& top);

 private:
  struct sigaction previous_term_ {};
  struct sigaction previous_int_ {};
};

}  // namespace fsdp::io
