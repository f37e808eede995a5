#pragma once
// Sharded checkpoints of any state (checkpoint/parts.h). Every rank writes
// its own shard of the parameters and of each optimizer's state
// (safetensors), rank 0 the buffers and one metadata.json that records the
// step, the configuration, the mesh, each parameter's global shape and which
// element ranges each rank's file holds, each optimizer's kind,
// hyperparameters and step counts, the program's states and a CRC-32 per
// file. A save is atomic: written into step_N.tmp/, fsynced,
// renamed to step_N/, and only then is `latest` pointed at it; the last K
// are kept. A load works at any world size and strategy: each rank reads,
// through memory maps, only the ranges it now holds.
//
// Layout:  DIR/latest                  "step_00000120"
//          DIR/step_00000120/metadata.json
//          DIR/step_00000120/rank_00000.safetensors ...
//          DIR/step_00000120/buffers.safetensors       (a model with buffers)

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "fsdp/checkpoint/metadata.h"
#include "fsdp/checkpoint/parts.h"
#include "fsdp/common/error.h"
#include "fsdp/distributed/process_group.h"

namespace fsdp::checkpoint {

// A save that could not be completed (a full disk, an unwritable
// directory): `latest` still names the previous checkpoint and the partial
// files are gone. Thrown on every rank, with the same message.
class SaveError : public Error {
 public:
  using Error::Error;
};

// Collective over `world`. Writes every part: each model's parameters (as
// each rank holds them: one replica writes each range) and buffers (rank
// 0's), each optimizer's per-parameter state sharded as its parameter is
// and its hyperparameters, each Stateful part's JSON, `state`, and how the
// first model is sharded (its strategy and mesh, which `state`'s own
// sharding and mesh do not override). Returns the checkpoint's directory.
// Throws SaveError when any rank fails to write its part; fsdp::Error,
// before anything is written, for parts that cannot be saved (an optimizer
// of another kind, one stepping a parameter no model holds).
std::string save(const std::string& dir, int keep, const Parts& parts, const TrainerState& state, dist::World& world);
// One model (its parameters keep their names) and one optimizer, named
// "optimizer": what the trainer saves.
std::string save(const std::string& dir, int keep, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                 const TrainerState& state, dist::World& world);

// The checkpoint `latest` points at, if any; throws if `latest` names a
// directory that is not there.
std::optional<std::string> latest(const std::string& dir);
// DIR/best names one checkpoint of DIR (the trainer's lowest validation
// loss), which pruning then never removes, whatever `keep` says. Written
// atomically by the caller's rank 0, once the checkpoint is published; the
// best before it goes unless it is one of the newest `keep`.
void mark_best(const std::string& dir, const std::string& checkpoint, int keep);
// The checkpoint DIR/best names, if any (as latest()).
std::optional<std::string> best(const std::string& dir);

// Collective over `world`. Loads every part into the program's, already
// sharded (or replicated) as it will train, whatever world size and
// strategy saved them; parts are matched by name. Throws fsdp::Error
// naming the part and both sides for a checkpoint of other parts (a
// parameter or buffer missing, extra or of another shape; an optimizer of
// another kind or over other parameter groups; a state it lacks), and
// naming the file for a missing or damaged one. Each file is read once and
// its checksum checked at its end, so after a damaged file the parameters
// and buffers may be partly loaded (optimizers and states are left as they
// were): load again, or start over, before training on. Checkpoints of
// versions 1 and 2 (one AdamW, no buffers) load into a model and an AdamW
// named "optimizer".
TrainerState load(const std::string& checkpoint, const Parts& parts, dist::World& world);
TrainerState load(const std::string& checkpoint, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                  dist::World& world);

// What is wrong with a checkpoint (its metadata, a missing file, a
// checksum that does not hold), or "" when it is intact. Reads every file.
std::string damage(const std::string& checkpoint);

// `fsdp ckpt inspect`: a summary, and whether every file's checksum holds.
std::string inspect(const std::string& checkpoint);

namespace detail {
class RankFiles;
// Removes DIR's step_N checkpoints but the newest `keep` and DIR/best's.
void prune(const std::string& dir, int keep);
}  // namespace detail

// Whole parameters of a checkpoint, read in this process (no world): each
// assembled from the pieces the ranks saved, every rank file checksummed on
// first use. What an export reads (models::export_checkpoint_hf).
class ParameterReader {
 public:
  // Throws fsdp::Error naming the checkpoint when its metadata is missing or damaged.
  explicit ParameterReader(const std::string& checkpoint);
  ~ParameterReader();
  ParameterReader(const ParameterReader&) = delete;
  ParameterReader& operator=(const ParameterReader&) = delete;

  const std::string& checkpoint() const { return checkpoint_; }
  const nlohmann::json& metadata() const { return meta_; }
  // Every saved parameter, name and global shape, in the metadata's order.
  std::vector<std::pair<std::string, std::vector<int64_t>>> parameters() const;
  // Parameter `name` whole, converted to `dtype`. Throws naming the file
  // that is missing or damaged, or the parameter the checkpoint lacks.
  at::Tensor read(const std::string& name, at::ScalarType dtype = at::kFloat);
  // Every saved buffer, name and shape (none before version 3), and one
  // whole, in its saved dtype.
  std::vector<std::pair<std::string, std::vector<int64_t>>> buffers() const;
  at::Tensor read_buffer(const std::string& name);

 private:
  std::string checkpoint_;
  nlohmann::json meta_;
  std::unique_ptr<detail::RankFiles> files_;
};

// `fsdp ckpt export --format safetensors`: every parameter whole, in its
// saved dtype, and every buffer, under the names the checkpoint holds them
// by, as one safetensors file at `out` (written atomically; an existing
// file is refused). Any checkpoint: the trainer's, or a program's of its own.
void consolidate_to_safetensors(const std::string& checkpoint, const std::string& out);

}  // namespace fsdp::checkpoint
