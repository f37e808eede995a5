#pragma once
// Sharded checkpoints. Every rank writes its own shard of the parameters and
// of the optimizer state (safetensors), and rank 0 one metadata.json that
// records the step, the configuration, the mesh, each parameter's global
// shape and which element ranges each rank's file holds, the trainer state
// and a CRC-32 per file. A save is atomic: written into step_N.tmp/, fsynced,
// renamed to step_N/, and only then is `latest` pointed at it; the last K
// are kept. A load works at any world size and strategy: each rank reads,
// through memory maps, only the ranges it now holds.
//
// Layout:  DIR/latest                  "step_00000120"
//          DIR/step_00000120/metadata.json
//          DIR/step_00000120/rank_00000.safetensors ...

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "fsdp/checkpoint/metadata.h"
#include "fsdp/common/error.h"
#include "fsdp/dist/process_group.h"

namespace fsdp::checkpoint {

// A save that could not be completed (a full disk, an unwritable
// directory): `latest` still names the previous checkpoint and the partial
// files are gone. Thrown on every rank, with the same message.
class SaveError : public Error {
 public:
  using Error::Error;
};

// Collective over `world`. Returns the checkpoint's directory. Throws
// SaveError when any rank fails to write its part.
std::string save(const std::string& dir, int keep, torch::nn::Module& model, torch::optim::AdamW& optimizer,
                 const TrainerState& state, dist::World& world);

// The checkpoint `latest` points at, if any; throws if `latest` names a
// directory that is not there.
std::optional<std::string> latest(const std::string& dir);

// Collective over `world`. Loads parameters and optimizer state into an
// already sharded model and its optimizer, whatever world size and strategy
// saved them. Throws fsdp::Error naming the file and the problem for a
// missing or damaged file, or metadata from another model. Each file is
// read once and its checksum checked at its end, so after a damaged file
// the parameters may be partly loaded (the optimizer is left as it was):
// load again, or start over, before training on.
TrainerState load(const std::string& checkpoint, torch::nn::Module& model, torch::optim::AdamW& optimizer,
                  dist::World& world);

// What is wrong with a checkpoint (its metadata, a missing file, a
// checksum that does not hold), or "" when it is intact. Reads every file.
std::string damage(const std::string& checkpoint);

// `fsdp ckpt inspect`: a summary, and whether every file's checksum holds.
std::string inspect(const std::string& checkpoint);

namespace detail {
class RankFiles;
}

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

 private:
  std::string checkpoint_;
  nlohmann::json meta_;
  std::unique_ptr<detail::RankFiles> files_;
};

}  // namespace fsdp::checkpoint
