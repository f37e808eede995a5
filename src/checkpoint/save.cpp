// Save: write each rank's file (and rank 0's buffers and metadata) into
// step_N.tmp/, agree on failure, publish as step_N/, move `latest`, prune.
#include "fsdp/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include <ATen/ATen.h>

#include "checkpoint/agreement.h"
#include "checkpoint/snapshot.h"
#include "fsdp/checkpoint/optimizer_state.h"
#include "fsdp/common/error_text.h"
#include "fsdp/common/fault_point.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/io/atomic_file.h"
#include "fsdp/io/remove_tree.h"
#include "fsdp/io/safetensors.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

using detail::kOptimizerColumns;
using detail::kShardColumns;
using detail::ranks_that_failed;
using detail::Snapshot;

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string rank_file(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank_%05d.safetensors", rank);
  return buf;
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

struct WrittenFile {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
  std::string error;  // why the file could not be written; empty when it was
};

// Save, stage 1: this rank's file (its shards, one replica writing each;
// each optimizer's state of them; its RNG) into the temporary directory.
void write_rank_file(const std::string& tmp_dir, const Snapshot& snap, int rank, WrittenFile& written) {
  try {
    io::SafetensorsWriter writer(tmp_dir + "/" + rank_file(rank), snap.specs);
    for (const auto& t : snap.tensors) writer.write(t);
    writer.commit();
    written.bytes = writer.bytes_written();
    written.crc32 = writer.crc32();
  } catch (const std::exception& e) {
    written.error = error_text(e);  // the ranks agree on it before going on
  }
}

constexpr const char* kBufferFile = "buffers.safetensors";

// Save, stage 1 on rank 0: every buffer whole, rank 0's values (the ranks'
// may differ: [Note: buffers in a checkpoint]). Its size and checksum, or
// nothing when there are no buffers.
std::optional<nlohmann::json> write_buffer_file(const std::string& tmp_dir, const Snapshot& snap,
                                                WrittenFile& written) {
  if (snap.buffers.empty()) return std::nullopt;
  std::vector<io::SafetensorsWriter::Spec> specs;
  for (const auto& [fqn, value] : snap.buffers)
    specs.push_back({"buffer/" + fqn, value.scalar_type(), value.sizes().vec()});
  try {
    io::SafetensorsWriter writer(tmp_dir + "/" + kBufferFile, specs);
    for (const auto& [fqn, value] : snap.buffers) writer.write(value.detach().contiguous());
    writer.commit();
    return nlohmann::json{{"name", kBufferFile}, {"bytes", writer.bytes_written()}, {"crc32", writer.crc32()}};
  } catch (const std::exception& e) {
    written.error = error_text(e);
    return std::nullopt;
  }
}

// Save, stage 2 (rank 0): metadata.json from every rank's table and file.
nlohmann::json build_metadata(const Snapshot& snap, const at::Tensor& all_tables, const at::Tensor& all_files,
                              const std::optional<nlohmann::json>& buffer_file, int w) {
  const TrainerState& state = snap.state;
  const auto n = static_cast<int64_t>(snap.params.size());
  const auto tables = all_tables.view({w, n, -1});
  nlohmann::json params = nlohmann::json::object();
  for (int64_t i = 0; i < n; ++i) {
    nlohmann::json pieces = nlohmann::json::array();
    for (int r = 0; r < w; ++r) {
      const auto row = tables[r][i];
      if (row[2].item<int64_t>() == 1) {
        pieces.push_back({{"rank", r}, {"begin", row[0].item<int64_t>()}, {"count", row[1].item<int64_t>()}});
      }
    }
    const auto& s = snap.params[static_cast<size_t>(i)];
    params[s.fqn] = {{"shape", s.shape}, {"dtype", io::safetensors_dtype_name(s.dtype)}, {"shards", pieces}};
  }
  nlohmann::json optimizers = nlohmann::json::object();
  for (size_t k = 0; k < snap.optimizers.size(); ++k) {
    const auto& o = snap.optimizers[k];
    const int64_t col = kShardColumns + kOptimizerColumns * static_cast<int64_t>(k);
    const auto& names = optimizer_state_tensors(o.kind);
    nlohmann::json groups = nlohmann::json::array(), saved_state = nlohmann::json::object();
    for (size_t g = 0; g < o.groups.size(); ++g) {
      nlohmann::json fqns = nlohmann::json::array();
      for (size_t i : o.groups[g]) {
        fqns.push_back(snap.params[i].fqn);
        int64_t has = 0, step = 0, mask = 0;
        for (int r = 0; r < w; ++r) {
          const auto row = tables[r][static_cast<int64_t>(i)];
          has |= row[col].item<int64_t>();
          step = std::max(step, row[col + 1].item<int64_t>());
          mask |= row[col + 2].item<int64_t>();
        }
        if (has == 0) continue;
        nlohmann::json held = nlohmann::json::array();
        for (size_t b = 0; b < names.size(); ++b) {
          if ((mask >> b) & 1) held.push_back(names[b]);
        }
        saved_state[snap.params[i].fqn] = {{"step", step}, {"tensors", held}};
      }
      groups.push_back({{"params", fqns}, {"options", o.options[g]}});
    }
    optimizers[o.name] = {{"kind", o.kind}, {"groups", groups}, {"state", saved_state}};
  }
  nlohmann::json buffers = nlohmann::json::object();
  for (const auto& [fqn, value] : snap.buffers) {
    buffers[fqn] = {{"shape", value.sizes().vec()}, {"dtype", io::safetensors_dtype_name(value.scalar_type())}};
  }
  nlohmann::json files = nlohmann::json::array();
  for (int r = 0; r < w; ++r) {
    files.push_back({{"rank", r},
                     {"name", rank_file(r)},
                     {"bytes", all_files[2 * r].item<int64_t>()},
                     {"crc32", static_cast<uint32_t>(all_files[2 * r + 1].item<int64_t>())}});
  }
  nlohmann::json meta = {{"format", kMetadataFormat},
                         {"version", kMetadataVersion},
                         {"step", state.step},
                         {"world_size", w},
                         {"sharding", snap.sharding.strategy},
                         {"mesh", snap.sharding.mesh},
                         {"config", state.config_yaml},
                         {"hf_config", state.hf_config},
                         {"trainer", {{"tokens_seen", state.tokens_seen}, {"loss_scale", state.loss_scale}}},
                         {"extra", state.extra},
                         {"params", params},
                         {"optimizers", optimizers},
                         {"buffers", buffers},
                         {"states", snap.states},
                         {"files", files}};
  if (buffer_file) meta["buffer_file"] = *buffer_file;
  if (snap.frozen_left_out) meta["frozen_left_out"] = true;
  return meta;
}

// Save, stage 3 (rank 0): the directory appears whole, then `latest` moves
// to it; then only the newest `keep` are kept.
void publish(const std::string& dir, const std::string& tmp_dir, const std::string& final_dir, const std::string& name,
             int keep) {
  fsync_dir(tmp_dir);
  fault_point("checkpoint.before_publish");
  io::remove_tree(final_dir);
  fs::rename(tmp_dir, final_dir);
  fsync_dir(dir);
  io::write_file_atomically(dir + "/latest", name + "\n");
  detail::prune(dir, keep);
}

// Every rank learns whether any failed at a stage of the save, and why (the
// message of the lowest failing rank, which every rank reports alike). On a
// failure rank 0 removes `partial`, so nothing half-written stays behind.
void agree_on_failure(dist::ProcessGroup& group, const std::string& local_error, const std::string& partial) {
  const auto failed = ranks_that_failed(group, !local_error.empty());
  if (failed.empty()) return;
  const int first = failed.front();
  // The failing rank's message, sent to all as bytes.
  at::Tensor length = at::full({1}, static_cast<int64_t>(local_error.size()), at::kLong);
  dist::broadcast(group, length, first).wait();
  at::Tensor text = at::zeros({length.item<int64_t>()}, at::kByte);
  if (group.rank() == first) std::memcpy(text.data_ptr(), local_error.data(), local_error.size());
  if (text.numel() > 0) dist::broadcast(group, text, first).wait();
  std::error_code ignored;
  if (group.rank() == 0) io::remove_tree(partial, ignored);
  const std::string why(reinterpret_cast<const char*>(text.data_ptr()), static_cast<size_t>(text.numel()));
  throw SaveError("saving checkpoint '" + partial + "' failed on rank " + std::to_string(first) + ": " + why +
                  "; its partial files were removed and `latest` still names the previous checkpoint");
}

}  // namespace

namespace detail {

std::string write_snapshot(const std::string& dir, int keep, const Snapshot& snap, dist::ProcessGroup& group) {
  const int rank = group.rank(), w = group.size();
  const std::string name = step_name(snap.state.step);
  const std::string final_dir = dir + "/" + name;
  const std::string tmp_dir = final_dir + ".tmp";
  std::string error;
  if (rank == 0) {
    try {
      fs::create_directories(dir);
      io::remove_tree(tmp_dir);  // an earlier save that died here
      fs::create_directories(tmp_dir);
    } catch (const std::exception& e) {
      error = error_text(e);
    }
  }
  agree_on_failure(group, error, tmp_dir);

  WrittenFile written;
  write_rank_file(tmp_dir, snap, rank, written);
  std::optional<nlohmann::json> buffer_file;
  if (rank == 0 && written.error.empty()) buffer_file = write_buffer_file(tmp_dir, snap, written);
  agree_on_failure(group, written.error, tmp_dir);

  // Rank 0 learns who holds what, and every file's size and checksum.
  at::Tensor all_tables = at::empty({w * snap.table.numel()}, at::kLong);
  dist::all_gather_into_tensor(group, all_tables, snap.table.view({-1})).wait();
  at::Tensor file_info =
      at::tensor({static_cast<int64_t>(written.bytes), static_cast<int64_t>(written.crc32)}, at::kLong);
  at::Tensor all_files = at::empty({2 * w}, at::kLong);
  dist::all_gather_into_tensor(group, all_files, file_info).wait();

  if (rank == 0) {
    try {
      io::write_file_atomically(tmp_dir + "/metadata.json",
                                sealed_metadata_text(build_metadata(snap, all_tables, all_files, buffer_file, w)));
      publish(dir, tmp_dir, final_dir, name, keep);
    } catch (const std::exception& e) {
      error = error_text(e);
      // Published but `latest` not moved: the directory goes too.
      std::error_code ignored;
      std::ifstream pointer(dir + "/latest");
      std::string named;
      std::getline(pointer, named);
      if (named != name) io::remove_tree(final_dir, ignored);
    }
  }
  agree_on_failure(group, error, tmp_dir);
  return final_dir;
}

}  // namespace detail

std::string save(const std::string& dir, int keep, const Parts& parts, const TrainerState& state, dist::World& world) {
  // Before anything is written: parts that cannot be saved are refused on
  // every rank alike, leaving the folder as it was.
  const auto snap = detail::agreed_snapshot(parts, state, world, /*copy=*/false);
  return detail::write_snapshot(dir, keep, *snap, world.group());
}

std::string save(const std::string& dir, int keep, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                 const TrainerState& state, dist::World& world) {
  return save(dir, keep, Parts().model("", model).optimizer("optimizer", optimizer), state, world);
}

}  // namespace fsdp::checkpoint
