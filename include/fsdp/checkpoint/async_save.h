#pragma once
// Checkpoints written while training goes on (torchtitan's async_mode,
// DCP's async_save). A save copies what it writes into host memory on the
// training thread, then writes, checksums and publishes it on a thread of
// its own, which agrees with the other ranks over a Gloo group of its own:
// the training's collectives keep their group and their order. The
// checkpoint is the same, file for file, as checkpoint::save's at that
// moment, and appears as atomically (step_N.tmp/, renamed, then `latest`):
// a kill at any moment leaves `latest` naming a whole checkpoint.
//
//   fsdp::checkpoint::AsyncSaver saver(*world);      // collective, once
//   ...
//   saver.save(dir, /*keep=*/2, parts, state);        // waits for the last, stages this one
//   ...                                               // training goes on
//   saver.wait();                                     // before exit: the last one published
//
// Memory: the host copy holds this rank's shards and optimizer state (for
// AdamW about 3x the shard's parameters) until the write is done.

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "fsdp/checkpoint/checkpoint.h"

namespace fsdp::checkpoint {

namespace detail {
struct Snapshot;
}

class AsyncSaver {
 public:
  // Collective over `world`: connects the saver's group.
  explicit AsyncSaver(dist::World& world);
  // Waits for a save in flight; its outcome is not reported (call wait()).
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Collective over the world. First waits for the save in flight, and
  // throws its SaveError (this save is then not started). Then copies the
  // parts to host memory and returns; the files are written in the
  // background. Parts that cannot be saved are refused here, as by
  // checkpoint::save, before anything is written; a rank that cannot copy
  // its part fails the save on every rank. `world` outlives the saver.
  void save(const std::string& dir, int keep, const Parts& parts, const TrainerState& state);
  // Blocks until the save in flight is published or has failed on every
  // rank; returns its directory (nothing when none was in flight) or throws
  // its SaveError. Every rank gets the same outcome.
  std::optional<std::string> wait();
  // Whether a save was started and not yet waited for.
  bool in_flight() const { return worker_.joinable(); }
  // Seconds the last save spent writing in the background.
  double last_write_seconds() const { return write_seconds_; }

 private:
  dist::World& world_;
  std::shared_ptr<dist::ProcessGroup> group_;
  std::thread worker_;
  std::string path_;
  std::exception_ptr error_;
  double write_seconds_ = 0;
};

}  // namespace fsdp::checkpoint
