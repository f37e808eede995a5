#include "fsdp/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>

#include "fsdp/common/error.h"
#include "fsdp/common/error_text.h"
#include "fsdp/common/fault_point.h"
#include "fsdp/checkpoint/optimizer_state.h"
#include "checkpoint/snapshot.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/core/replicate.h"
#include "fsdp/dist/collectives.h"
#include "fsdp/io/atomic_file.h"
#include "fsdp/io/input_file.h"
#include "fsdp/io/remove_tree.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/io/streamed_read.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace detail {

// RankFiles' key for the file of buffers rank 0 writes beside its own.
constexpr int kBufferFileRank = -1;

// Bytes [at, at + size) of a rank file, to be copied to `to` as the file
// streams past (a load's read of one range straight into its shard).
struct FileCopy {
  uint64_t at = 0;
  uint64_t size = 0;
  char* to = nullptr;
};

// The saved files of one checkpoint, opened on first use, each checksummed
// once: on its own (get), or while a load streams it (stream).
class RankFiles {
 public:
  RankFiles(std::string dir, const nlohmann::json& meta) : dir_(std::move(dir)) {
    for (const auto& f : meta["files"]) info_[f["rank"].get<int>()] = f;
    if (meta.contains("buffer_file")) info_[kBufferFileRank] = meta["buffer_file"];
  }
  // Opened, its size checked, its checksum not yet.
  const io::SafetensorsFile& open(int rank) {
    auto it = open_.find(rank);
    if (it != open_.end()) return *it->second;
    const std::string path = path_of(rank);
    FSDP_CHECK(fs::exists(path), "checkpoint '", dir_, "': rank file '", path, "' is missing");
    const auto size = static_cast<int64_t>(fs::file_size(path));
    FSDP_CHECK(size == info_.at(rank)["bytes"].get<int64_t>(), "checkpoint file '", path, "' is ", size,
               " bytes but was written with ", info_.at(rank)["bytes"].get<int64_t>(), " (truncated or replaced)");
    return *open_.emplace(rank, std::make_unique<io::SafetensorsFile>(path)).first->second;
  }
  // Opened and checksummed.
  const io::SafetensorsFile& get(int rank) {
    const auto& file = open(rank);
    if (verified_.count(rank) == 0) check_crc(rank, io::read_streamed(file.path(), {}));
    return file;
  }
  // Reads the file once, serving `copies` (any order) from its blocks as
  // they pass, and checks its checksum at the end: the copied bytes are
  // the file's only if this returns.
  void stream(int rank, std::vector<FileCopy>& copies) {
    const auto& file = open(rank);
    std::sort(copies.begin(), copies.end(), [](const FileCopy& a, const FileCopy& b) { return a.at < b.at; });
    size_t first = 0;  // copies ending before the current block are done
    const uint32_t crc = io::read_streamed(file.path(), [&](uint64_t offset, const char* data, size_t size) {
      const uint64_t end = offset + size;
      while (first < copies.size() && copies[first].at + copies[first].size <= offset) ++first;
      for (size_t i = first; i < copies.size() && copies[i].at < end; ++i) {
        const FileCopy& c = copies[i];
        const uint64_t lo = std::max(c.at, offset), hi = std::min(c.at + c.size, end);
        if (hi > lo) std::memcpy(c.to + (lo - c.at), data + (lo - offset), hi - lo);
      }
    });
    check_crc(rank, crc);
  }

 private:
  std::string path_of(int rank) const {
    const auto info = info_.find(rank);
    FSDP_CHECK(info != info_.end(), "checkpoint '", dir_, "': metadata lists no file for rank ", rank);
    return dir_ + "/" + info->second["name"].get<std::string>();
  }
  void check_crc(int rank, uint32_t crc) {
    const auto expected = info_.at(rank)["crc32"].get<uint32_t>();
    FSDP_CHECK(crc == expected, "checkpoint file '", path_of(rank), "' fails its checksum (CRC-32 ", crc,
               ", expected ", expected, "): the file is damaged");
    verified_.insert(rank);
  }

  std::string dir_;
  std::map<int, nlohmann::json> info_;
  std::map<int, std::unique_ptr<io::SafetensorsFile>> open_;
  std::set<int> verified_;
};

}  // namespace detail

namespace {

using detail::FileCopy;
using detail::kBufferFileRank;
using detail::RankFiles;

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

// Calls fn(rank, lo, hi, piece_begin) for each saved piece of `tensor`
// overlapping elements [begin, begin + n); throws unless they cover them.
template <typename Fn>
void for_each_piece(const nlohmann::json& pieces, int64_t begin, int64_t n, const std::string& what, Fn&& fn) {
  int64_t covered = 0;
  for (const auto& piece : pieces) {
    const int64_t pb = piece["begin"].get<int64_t>(), pn = piece["count"].get<int64_t>();
    const int64_t lo = std::max(begin, pb), hi = std::min(begin + n, pb + pn);
    if (hi <= lo) continue;
    fn(piece["rank"].get<int>(), lo, hi, pb);
    covered += hi - lo;
  }
  FSDP_CHECK(covered == n, "checkpoint: ", what, " covers ", covered, " of the ", n, " elements this rank needs");
}

// Copies elements [begin, begin + out.numel()) of `tensor` (a saved
// parameter or moment, spread over rank files) into `out`.
void gather_range(RankFiles& files, const nlohmann::json& pieces, const std::string& tensor, int64_t begin,
                  const at::Tensor& out, const std::string& what) {
  for_each_piece(pieces, begin, out.numel(), what, [&](int rank, int64_t lo, int64_t hi, int64_t pb) {
    files.get(rank).read_range_into(tensor, lo - pb, out.narrow(0, lo - begin, hi - lo));
  });
}

}  // namespace

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
  FSDP_CHECK(fs::is_directory(dir + "/" + name), "best checkpoint '", checkpoint, "' is not a checkpoint of '", dir, "'");
  io::write_file_atomically(dir + "/best", name + "\n");
  detail::prune(dir, keep);  // the best before, kept only as the best, goes
}

namespace {

struct WrittenFile {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
  std::string error;  // why the file could not be written; empty when it was
};

// What the parts hold, gathered once per save or load: every model's
// parameters (as this rank holds them) and buffers under their checkpoint
// names, and every optimizer with its kind and its parameters' indices.
struct Contents {
  struct Optimizer {
    std::string name;
    torch::optim::Optimizer* optimizer = nullptr;
    std::string kind;
    std::vector<std::vector<size_t>> groups;  // per parameter group, indices into `shards`
  };
  std::vector<LocalShard> shards;
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  std::vector<Optimizer> optimizers;
  ShardingRecord sharding;
};

Contents contents_of(const Parts& parts, int world_size) {
  Contents c;
  FSDP_CHECK(!parts.models.empty(), "checkpoint: the parts name no model");
  std::unordered_map<const void*, size_t> index;  // parameter -> shard
  std::set<std::string> names;
  for (const auto& [name, module] : parts.models) {
    const std::string prefix = name.empty() ? "" : name + ".";
    for (auto& s : local_shards(*module)) {
      s.fqn = prefix + s.fqn;
      FSDP_CHECK(names.insert(s.fqn).second, "checkpoint: two model parts hold a parameter named '", s.fqn,
                 "'; give the models distinct names");
      index[s.param.unsafeGetTensorImpl()] = c.shards.size();
      c.shards.push_back(std::move(s));
    }
    for (const auto& item : module->named_buffers(/*recurse=*/true)) {
      if (!item.value().defined()) continue;
      const std::string fqn = prefix + item.key();
      FSDP_CHECK(names.insert(fqn).second, "checkpoint: two model parts hold a tensor named '", fqn,
                 "'; give the models distinct names");
      c.buffers.emplace_back(fqn, item.value());
    }
  }
  std::set<std::string> optimizer_names;
  for (const auto& [name, optimizer] : parts.optimizers) {
    FSDP_CHECK(!name.empty() && name.find('/') == std::string::npos && optimizer_names.insert(name).second,
               "checkpoint: optimizer part '", name, "' needs a name of its own, without '/'");
    Contents::Optimizer o{name, optimizer, optimizer_kind(*optimizer), {}};
    for (const auto& group : optimizer->param_groups()) {
      auto& indices = o.groups.emplace_back();
      for (const auto& p : group.params()) {
        const auto it = index.find(p.unsafeGetTensorImpl());
        FSDP_CHECK(it != index.end(), "checkpoint: optimizer '", name, "' steps a parameter of shape ", p.sizes(),
                   " that none of the model parts holds (create the optimizer after fully_shard, over the "
                   "models' parameters)");
        indices.push_back(it->second);
      }
    }
    c.optimizers.push_back(std::move(o));
  }
  c.sharding = sharding_of(*parts.models.front().second);
  if (c.sharding.strategy.empty()) {
    c.sharding = {is_replicated(*parts.models.front().second) ? "replicate" : "unsharded", {world_size, 1}};
  }
  return c;
}

std::string optimizer_tensor_name(const std::string& optimizer, const std::string& tensor, const std::string& fqn) {
  return "optimizer/" + optimizer + "/" + tensor + "/" + fqn;
}

// An optimizer a checkpoint holds, read from metadata of any version:
// versions 1 and 2 held the trainer's AdamW alone, as "optimizer", with its
// moments under "exp_avg/<fqn>" and no hyperparameters.
struct SavedOptimizer {
  std::string kind;
  const nlohmann::json* groups = nullptr;  // null: not saved
  struct State {
    int64_t step = 0;
    std::vector<std::string> tensors;
  };
  std::map<std::string, State> state;  // by parameter
  bool legacy = false;
  std::string tensor_name(const std::string& optimizer, const std::string& tensor, const std::string& fqn) const {
    return legacy ? tensor + "/" + fqn : optimizer_tensor_name(optimizer, tensor, fqn);
  }
};

std::map<std::string, SavedOptimizer> saved_optimizers(const nlohmann::json& meta) {
  std::map<std::string, SavedOptimizer> out;
  if (meta["version"].get<int>() < 3) {
    SavedOptimizer& adam = out["optimizer"];
    adam.kind = "adamw";
    adam.legacy = true;
    for (const auto& [fqn, p] : meta["params"].items()) {
      const int64_t step = p["adam_step"].get<int64_t>();
      if (step > 0) adam.state[fqn] = {step, {"exp_avg", "exp_avg_sq"}};
    }
    return out;
  }
  for (const auto& [name, o] : meta["optimizers"].items()) {  // version 3 holds it (parse_metadata)
    SavedOptimizer& saved = out[name];
    saved.kind = o["kind"].get<std::string>();
    saved.groups = &o["groups"];
    for (const auto& [fqn, s] : o["state"].items()) {
      saved.state[fqn] = {s["step"].get<int64_t>(), s["tensors"].get<std::vector<std::string>>()};
    }
  }
  return out;
}

// A save's snapshot: everything it writes, taken from the parts at once,
// so that writing needs nothing of the program (detail::Snapshot). Per
// parameter the table holds (begin, count, writes), then per optimizer
// (has state, step, which state tensors: a bit per optimizer_state_tensors
// entry); rank 0 gathers every rank's to build the metadata.
constexpr int64_t kShardColumns = 3, kOptimizerColumns = 3;

// A copy in host memory that the program's next steps do not change
// (async saves), or the tensor itself (a save that writes before it returns).
at::Tensor keep(const at::Tensor& t, bool copy) {
  if (!copy) return t;
  return t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
}

}  // namespace

namespace detail {

std::shared_ptr<Snapshot> snapshot(const Parts& parts, const TrainerState& state, int rank, int world_size,
                                   bool copy) {
  const Contents c = contents_of(parts, world_size);
  auto snap = std::make_shared<Snapshot>();
  snap->state = state;
  snap->sharding = c.sharding;
  std::vector<io::SafetensorsWriter::Spec>& specs = snap->specs;
  std::vector<at::Tensor>& tensors = snap->tensors;
  const auto columns = kShardColumns + kOptimizerColumns * static_cast<int64_t>(c.optimizers.size());
  at::Tensor table = at::zeros({static_cast<int64_t>(c.shards.size()), columns}, at::kLong);
  auto rows = table.accessor<int64_t, 2>();
  for (size_t i = 0; i < c.shards.size(); ++i) {
    const auto& s = c.shards[i];
    snap->params.push_back({s.fqn, s.shape, s.local.scalar_type()});
    const bool writes = (s.sharded ? s.replica == 0 : rank == 0) && s.numel > 0;
    rows[i][0] = s.begin;
    rows[i][1] = s.numel;
    rows[i][2] = writes ? 1 : 0;
    if (writes) {
      specs.push_back({"model/" + s.fqn, s.local.scalar_type(), {s.numel}});
      tensors.push_back(keep(s.local, copy));
    }
  }
  for (size_t k = 0; k < c.optimizers.size(); ++k) {
    const auto& o = c.optimizers[k];
    Snapshot::Optimizer& saved = snap->optimizers.emplace_back();
    saved.name = o.name;
    saved.kind = o.kind;
    saved.groups = o.groups;
    for (const auto& group : o.optimizer->param_groups()) saved.options.push_back(group_options(o.kind, group.options()));
    const auto& names = optimizer_state_tensors(o.kind);
    auto& states = o.optimizer->state();
    for (const auto& group : o.groups) {
      for (size_t i : group) {
        const auto& s = c.shards[i];
        const auto it = states.find(compat::optimizer_state_key(s.param));
        if (it == states.end()) continue;
        const ParamState state = read_param_state(o.kind, *it->second);
        const int64_t col = kShardColumns + kOptimizerColumns * static_cast<int64_t>(k);
        rows[i][col] = 1;
        rows[i][col + 1] = state.step;
        for (const auto& [tensor, value] : state.tensors) {
          FSDP_CHECK(value.numel() == s.param.numel(), "checkpoint: optimizer '", o.name, "' holds '", tensor,
                     "' of ", value.numel(), " elements for parameter '", s.fqn, "' of ", s.param.numel(),
                     ": only state shaped like its parameter is saved");
          rows[i][col + 2] |= int64_t{1} << (std::find(names.begin(), names.end(), tensor) - names.begin());
          if (rows[i][2] == 0) continue;
          specs.push_back({optimizer_tensor_name(o.name, tensor, s.fqn), value.scalar_type(), {s.numel}});
          tensors.push_back(keep(value.reshape({-1}), copy));
        }
      }
    }
  }
  const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  specs.push_back({"rng/cpu", rng.scalar_type(), rng.sizes().vec()});
  tensors.push_back(rng);
  snap->table = table;
  // Rank 0 writes the buffers (its own values: [Note: buffers in a
  // checkpoint]) and the metadata, with the states' JSON.
  if (rank == 0) {
    for (const auto& [fqn, value] : c.buffers) snap->buffers.emplace_back(fqn, keep(value.contiguous(), copy));
    snap->states = nlohmann::json::object();
    for (const auto& [name, part] : parts.states) snap->states[name] = part->state_dict();
  }
  return snap;
}

}  // namespace detail

namespace {

using detail::Snapshot;

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
std::optional<nlohmann::json> write_buffer_file(const std::string& tmp_dir, const Snapshot& snap, WrittenFile& written) {
  if (snap.buffers.empty()) return std::nullopt;
  std::vector<io::SafetensorsWriter::Spec> specs;
  for (const auto& [fqn, value] : snap.buffers) specs.push_back({"buffer/" + fqn, value.scalar_type(), value.sizes().vec()});
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

}  // namespace

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

namespace {

// Every rank learns which ranks failed at this point (none: empty), so a
// failure on one never leaves the others waiting in a later collective.
std::vector<int> ranks_that_failed(dist::ProcessGroup& group, bool failed_here) {
  at::Tensor failed = at::zeros({group.size()}, at::kInt);
  failed[group.rank()] = failed_here ? 1 : 0;
  dist::all_reduce(group, failed).wait();
  std::vector<int> ranks;
  for (int r = 0; r < group.size(); ++r) {
    if (failed[r].item<int>() != 0) ranks.push_back(r);
  }
  return ranks;
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

namespace detail {

std::shared_ptr<Snapshot> agreed_snapshot(const Parts& parts, const TrainerState& state, dist::World& world,
                                          bool copy) {
  std::shared_ptr<Snapshot> snap;
  std::exception_ptr error;
  try {
    snap = snapshot(parts, state, world.rank(), world.size(), copy);
  } catch (...) {
    error = std::current_exception();
  }
  const auto failed = ranks_that_failed(world.group(), error != nullptr);
  if (error) std::rethrow_exception(error);
  FSDP_CHECK(failed.empty(), "checkpoint: rank ", failed.empty() ? 0 : failed.front(),
             " could not take its part of the save (its error says why); nothing was written");
  return snap;
}

}  // namespace detail

std::string save(const std::string& dir, int keep, const Parts& parts, const TrainerState& state,
                 dist::World& world) {
  // Before anything is written: parts that cannot be saved are refused on
  // every rank alike, leaving the folder as it was.
  const auto snap = detail::agreed_snapshot(parts, state, world, /*copy=*/false);
  return detail::write_snapshot(dir, keep, *snap, world.group());
}

std::string save(const std::string& dir, int keep, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                 const TrainerState& state, dist::World& world) {
  return save(dir, keep, Parts().model("", model).optimizer("optimizer", optimizer), state, world);
}

namespace {

// What a load reads from each rank file, straight into the shards while
// the file streams past ([Note: checkpoint reads at the disk's pace]), and
// the copies that convert dtypes or fill strided memory, made from the
// mapped file once it is verified.
struct LoadPlan {
  std::map<int, std::vector<FileCopy>> streamed;
  std::vector<std::function<void()>> converted;
};

// gather_range's plan: elements [begin, begin + out.numel()) of `tensor`.
void plan_range(RankFiles& files, const nlohmann::json& pieces, const std::string& tensor, int64_t begin,
                const at::Tensor& out, const std::string& what, LoadPlan& plan) {
  for_each_piece(pieces, begin, out.numel(), what, [&](int rank, int64_t lo, int64_t hi, int64_t pb) {
    const auto& file = files.open(rank);
    const at::Tensor source = file.read_range(tensor, lo - pb, hi - lo);  // checks the range; reads nothing
    const at::Tensor to = out.narrow(0, lo - begin, hi - lo);
    if (to.is_contiguous() && to.device().is_cpu() && to.scalar_type() == source.scalar_type()) {
      const auto at = static_cast<uint64_t>(static_cast<const char*>(source.data_ptr()) -
                                            static_cast<const char*>(file.view(tensor).data_ptr())) +
                      file.file_offset(*file.find(tensor));
      plan.streamed[rank].push_back({at, static_cast<uint64_t>(to.nbytes()), static_cast<char*>(to.data_ptr())});
    } else {
      plan.converted.emplace_back([&files, rank, tensor, lo, pb, hi, to] {
        to.copy_(files.get(rank).read_range(tensor, lo - pb, hi - lo));
      });
    }
  });
}

// Everything a load checks before it reads a byte: the same parameters
// with the same shapes, the same buffers, optimizers of the same kinds over
// the same parameter groups, and every named state. Throws naming the part
// and both sides.
void check_parts_match(const std::string& checkpoint, const nlohmann::json& meta, const Contents& c,
                       const Parts& parts, const std::map<std::string, SavedOptimizer>& saved) {
  const auto& params = meta["params"];
  for (const auto& s : c.shards) {
    FSDP_CHECK(params.contains(s.fqn), "checkpoint '", checkpoint, "' is from another model: it has no parameter '",
               s.fqn, "'");
    const auto shape = params[s.fqn]["shape"].get<std::vector<int64_t>>();
    FSDP_CHECK(shape == s.shape, "checkpoint '", checkpoint, "' is from another model or config: parameter '", s.fqn,
               "' was saved with shape ", c10::IntArrayRef(shape), ", this model has ", c10::IntArrayRef(s.shape));
  }
  // A key the program lacks, named as every other mismatch is.
  if (params.size() != c.shards.size()) {
    std::set<std::string> mine;
    for (const auto& s : c.shards) mine.insert(s.fqn);
    for (const auto& [fqn, unused] : params.items()) {
      FSDP_CHECK(mine.count(fqn) != 0, "checkpoint '", checkpoint, "' holds parameter '", fqn,
                 "', which this model has not (", params.size(), " parameters there, ", c.shards.size(),
                 " here): it is from another model");
    }
  }
  FSDP_CHECK(params.size() == c.shards.size(), "checkpoint '", checkpoint, "' holds ", params.size(),
             " parameters, this model ", c.shards.size(), ": it is from another model");
  if (meta.contains("buffers")) {  // versions 1 and 2 saved none
    const auto& buffers = meta["buffers"];
    for (const auto& [fqn, value] : c.buffers) {
      FSDP_CHECK(buffers.contains(fqn), "checkpoint '", checkpoint, "' has no buffer '", fqn,
                 "', which this model has: it is from another model");
      const auto shape = buffers[fqn]["shape"].get<std::vector<int64_t>>();
      FSDP_CHECK(shape == value.sizes().vec(), "checkpoint '", checkpoint, "': buffer '", fqn, "' was saved with shape ",
                 c10::IntArrayRef(shape), ", this model has ", value.sizes());
    }
    std::set<std::string> mine;
    for (const auto& [fqn, unused] : c.buffers) mine.insert(fqn);
    for (const auto& [fqn, unused] : buffers.items()) {
      FSDP_CHECK(mine.count(fqn) != 0, "checkpoint '", checkpoint, "' holds buffer '", fqn,
                 "', which this model has not: it is from another model");
    }
    FSDP_CHECK(buffers.size() == c.buffers.size(), "checkpoint '", checkpoint, "' holds ", buffers.size(),
               " buffers, this model ", c.buffers.size(), ": it is from another model");
  }
  for (const auto& o : c.optimizers) {
    const auto it = saved.find(o.name);
    if (it == saved.end()) {
      std::string names;
      for (const auto& [n, unused] : saved) names += (names.empty() ? "'" : ", '") + n + "'";
      throw Error("checkpoint '" + checkpoint + "' holds no optimizer '" + o.name + "' (it holds " +
                  (names.empty() ? std::string("none") : names) + ")");
    }
    const SavedOptimizer& s = it->second;
    FSDP_CHECK(s.kind == o.kind, "checkpoint '", checkpoint, "': optimizer '", o.name, "' was saved from ", s.kind,
               ", this program's is ", o.kind, ": its state does not carry over");
    if (s.groups == nullptr) continue;
    FSDP_CHECK(s.groups->size() == o.groups.size(), "checkpoint '", checkpoint, "': optimizer '", o.name, "' had ",
               s.groups->size(), " parameter group(s), this program's has ", o.groups.size());
    for (size_t g = 0; g < o.groups.size(); ++g) {
      const auto fqns = (*s.groups)[g]["params"].get<std::vector<std::string>>();
      std::vector<std::string> ours;
      for (size_t i : o.groups[g]) ours.push_back(c.shards[i].fqn);
      const auto differ = std::mismatch(fqns.begin(), fqns.end(), ours.begin(), ours.end());
      FSDP_CHECK(differ.first == fqns.end() && differ.second == ours.end(), "checkpoint '", checkpoint,
                 "': optimizer '", o.name, "' group ", g, " held ", fqns.size(), " parameter(s), this program's ",
                 ours.size(), "; first difference: saved '", differ.first == fqns.end() ? "(none)" : *differ.first,
                 "', here '", differ.second == ours.end() ? "(none)" : *differ.second, "'");
    }
  }
  for (const auto& [name, part] : parts.states) {
    (void)part;
    FSDP_CHECK(meta.contains("states") && meta["states"].contains(name), "checkpoint '", checkpoint,
               "' holds no state '", name, "'");
  }
}

// Load: this rank's ranges of every parameter and of each optimizer's
// state, the buffers whole, and, when each rank maps to one saved, that
// rank's random state. The parameters and buffers are written as their
// files stream past, before the files' checksums are known: a failed load
// leaves them partly loaded (the optimizers' state is set only after every
// file checked out).
at::Tensor read_ranges(const std::string& checkpoint, const nlohmann::json& meta, const Contents& c,
                       const std::map<std::string, SavedOptimizer>& saved, const dist::World& world) {
  const auto& params = meta["params"];
  RankFiles files(checkpoint, meta);
  torch::NoGradGuard no_grad;
  LoadPlan plan;
  for (const auto& s : c.shards) {
    plan_range(files, params[s.fqn]["shards"], "model/" + s.fqn, s.begin, s.local, "parameter '" + s.fqn + "'", plan);
  }
  std::vector<std::pair<at::Tensor, at::Tensor>> buffers;  // (read into, buffer)
  if (meta.contains("buffer_file")) {
    for (const auto& [fqn, value] : c.buffers) {
      at::Tensor into = at::empty({value.numel()}, value.options().device(at::kCPU));
      const nlohmann::json whole = nlohmann::json::array({{{"rank", kBufferFileRank}, {"begin", 0}, {"count", value.numel()}}});
      plan_range(files, whole, "buffer/" + fqn, 0, into, "buffer '" + fqn + "'", plan);
      buffers.emplace_back(into, value);
    }
  }
  // Per optimizer, per parameter with saved state: the state, its tensors
  // filled by the plan.
  std::vector<std::vector<std::pair<size_t, ParamState>>> states(c.optimizers.size());
  for (size_t k = 0; k < c.optimizers.size(); ++k) {
    const auto& o = c.optimizers[k];
    const SavedOptimizer& from = saved.at(o.name);
    for (const auto& group : o.groups) {
      for (size_t i : group) {
        const auto& s = c.shards[i];
        const auto it = from.state.find(s.fqn);
        if (it == from.state.end()) continue;
        ParamState state;
        state.step = it->second.step;
        for (const auto& tensor : it->second.tensors) {
          at::Tensor value = at::empty_like(s.param);  // every element is written, or plan_range throws
          plan_range(files, params[s.fqn]["shards"], from.tensor_name(o.name, tensor, s.fqn), s.begin,
                     value.view({-1}), o.name + " '" + tensor + "' of '" + s.fqn + "'", plan);
          state.tensors.emplace_back(tensor, value);
        }
        states[k].emplace_back(i, std::move(state));
      }
    }
  }
  for (auto& [rank, copies] : plan.streamed) files.stream(rank, copies);
  for (const auto& convert : plan.converted) convert();
  for (auto& [into, buffer] : buffers) buffer.detach().copy_(into.view(buffer.sizes()));
  for (size_t k = 0; k < c.optimizers.size(); ++k) {
    const auto& o = c.optimizers[k];
    auto& held = o.optimizer->state();
    for (const auto& group : o.groups) {
      for (size_t i : group) held.erase(compat::optimizer_state_key(c.shards[i].param));
    }
    for (auto& [i, state] : states[k]) {
      held[compat::optimizer_state_key(c.shards[i].param)] = make_param_state(o.kind, state);
    }
  }
  if (meta["world_size"].get<int>() != world.size()) return {};
  // Checked here, where the file is known: set_state's own message names neither.
  const auto& own = files.get(world.rank());
  const auto* entry = own.find("rng/cpu");
  const at::Tensor expected = at::detail::getDefaultCPUGenerator().get_state();
  FSDP_CHECK(entry != nullptr && entry->dtype == expected.scalar_type() && entry->shape == expected.sizes().vec(),
             "'", own.path(), "': its random state 'rng/cpu' is ",
             entry == nullptr ? std::string("missing")
                              : std::string(io::safetensors_dtype_name(entry->dtype)) + " " +
                                    c10::str(c10::IntArrayRef(entry->shape)),
             ", expected ", io::safetensors_dtype_name(expected.scalar_type()), " ", expected.sizes(),
             " (a damaged file, or one written by another LibTorch)");
  return own.view("rng/cpu").clone();
}

}  // namespace

TrainerState load(const std::string& checkpoint, const Parts& parts, dist::World& world) {
  const nlohmann::json meta = read_metadata(checkpoint);
  const Contents c = contents_of(parts, world.size());
  const auto saved = saved_optimizers(meta);
  check_parts_match(checkpoint, meta, c, parts, saved);

  // A rank that cannot read its ranges (a damaged or missing file) must not
  // leave the others waiting in a collective that then fails with a
  // transport error: every rank learns which ranks failed, each of those
  // reports its own cause, and the rest name them.
  std::string failure;
  at::Tensor rng;
  try {
    rng = read_ranges(checkpoint, meta, c, saved, world);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const auto ranks = ranks_that_failed(world.group(), !failure.empty());
  if (!failure.empty()) throw Error(failure);
  if (!ranks.empty()) {
    std::string list;
    for (int r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
    throw Error("checkpoint '" + checkpoint + "' could not be loaded by rank(s) " + list + " (their error says why)");
  }
  // Hyperparameters and the program's states, once every file checked out.
  for (const auto& o : c.optimizers) {
    const SavedOptimizer& from = saved.at(o.name);
    if (from.groups == nullptr) continue;
    for (size_t g = 0; g < o.groups.size(); ++g) {
      set_group_options(o.kind, o.optimizer->param_groups()[g].options(), (*from.groups)[g]["options"],
                        "checkpoint '" + checkpoint + "': optimizer '" + o.name + "' group " + std::to_string(g));
    }
  }
  for (const auto& [name, part] : parts.states) part->load_state_dict(meta["states"][name]);
  // The random stream continues where it was.
  if (rng.defined()) {
    auto generator = at::detail::getDefaultCPUGenerator();  // a handle to the global generator
    generator.set_state(rng);
  }
  dist::barrier(world.group());
  return trainer_state(meta);
}

TrainerState load(const std::string& checkpoint, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                  dist::World& world) {
  return load(checkpoint, Parts().model("", model).optimizer("optimizer", optimizer), world);
}

namespace {

// Every file of a checkpoint with its RankFiles key: the ranks', then the buffers'.
std::vector<std::pair<int, nlohmann::json>> files_of(const nlohmann::json& meta) {
  std::vector<std::pair<int, nlohmann::json>> out;
  for (const auto& f : meta["files"]) out.emplace_back(f["rank"].get<int>(), f);
  if (meta.contains("buffer_file")) out.emplace_back(kBufferFileRank, meta["buffer_file"]);
  return out;
}

}  // namespace

std::string damage(const std::string& checkpoint) {
  try {
    const nlohmann::json meta = read_metadata(checkpoint);
    RankFiles files(checkpoint, meta);
    for (const auto& [key, f] : files_of(meta)) files.get(key);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string inspect(const std::string& checkpoint) {
  const nlohmann::json meta = read_metadata(checkpoint);
  std::ostringstream out;
  int64_t elements = 0;
  for (const auto& [name, p] : meta["params"].items()) {
    (void)name;
    int64_t n = 1;
    for (auto d : p["shape"]) n *= d.get<int64_t>();
    elements += n;
  }
  out << "checkpoint " << checkpoint << "\n"
      << "  step " << meta["step"] << ", saved by " << meta["world_size"] << " rank(s), sharding "
      << meta.value("sharding", "?") << ", mesh " << meta.value("mesh", nlohmann::json::array()).dump() << "\n"
      << "  " << meta["params"].size() << " parameters, " << elements << " elements, tokens seen "
      << meta["trainer"].value("tokens_seen", int64_t{0}) << "\n";
  if (!meta.value("buffers", nlohmann::json::object()).empty()) out << "  " << meta["buffers"].size() << " buffers\n";
  for (const auto& [name, o] : saved_optimizers(meta)) {
    out << "  optimizer '" << name << "': " << o.kind << ", state for " << o.state.size() << " parameters\n";
  }
  if (meta.contains("states")) {
    for (const auto& [name, unused] : meta["states"].items()) out << "  state '" << name << "'\n";
  }
  RankFiles files(checkpoint, meta);
  bool ok = true;
  for (const auto& [key, f] : files_of(meta)) {
    std::string status = "ok";
    try {
      files.get(key);
    } catch (const Error& e) {
      status = std::string("BAD: ") + e.what();
      ok = false;
    }
    out << "  " << f["name"].get<std::string>() << "  " << f["bytes"] << " bytes  crc32 " << f["crc32"] << "  "
        << status << "\n";
  }
  out << (ok ? "  checksums: all files intact\n" : "  checksums: DAMAGED files above\n");
  return out.str();
}

ParameterReader::ParameterReader(const std::string& checkpoint)
    : checkpoint_(checkpoint),
      meta_(read_metadata(checkpoint)),
      files_(std::make_unique<RankFiles>(checkpoint, meta_)) {}

ParameterReader::~ParameterReader() = default;

std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterReader::parameters() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;
  for (const auto& [name, p] : meta_["params"].items()) {
    params.emplace_back(name, p["shape"].get<std::vector<int64_t>>());
  }
  return params;
}

at::Tensor ParameterReader::read(const std::string& name, at::ScalarType dtype) {
  const auto& params = meta_["params"];
  FSDP_CHECK(params.contains(name), "checkpoint '", checkpoint_, "' has no parameter '", name, "'");
  at::Tensor full = at::empty(params[name]["shape"].get<std::vector<int64_t>>(), dtype);
  gather_range(*files_, params[name]["shards"], "model/" + name, 0, full.view({-1}), "parameter '" + name + "'");
  return full;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterReader::buffers() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  if (!meta_.contains("buffers")) return out;
  for (const auto& [name, b] : meta_["buffers"].items()) out.emplace_back(name, b["shape"].get<std::vector<int64_t>>());
  return out;
}

at::Tensor ParameterReader::read_buffer(const std::string& name) {
  FSDP_CHECK(meta_.contains("buffers") && meta_["buffers"].contains(name), "checkpoint '", checkpoint_,
             "' has no buffer '", name, "'");
  return files_->get(kBufferFileRank).view("buffer/" + name).clone();
}

void consolidate_to_safetensors(const std::string& checkpoint, const std::string& out) {
  FSDP_CHECK(!fs::exists(fs::symlink_status(out)), "'", out,
             "' exists; the consolidated safetensors file goes to a new path");
  ParameterReader reader(checkpoint);
  const auto& params = reader.metadata()["params"];
  std::vector<io::SafetensorsWriter::Spec> specs;
  for (const auto& [name, shape] : reader.parameters()) {
    const auto* dtype = params[name].contains("dtype") ? &params[name]["dtype"] : nullptr;
    const at::ScalarType saved = dtype != nullptr ? io::safetensors_dtype(dtype->get<std::string>()) : at::kFloat;
    specs.push_back({name, saved, shape});
  }
  const auto buffers = reader.buffers();
  std::vector<at::Tensor> buffer_values;
  for (const auto& [name, shape] : buffers) {
    buffer_values.push_back(reader.read_buffer(name));
    specs.push_back({name, buffer_values.back().scalar_type(), shape});
  }
  io::SafetensorsWriter writer(out, specs);
  const auto parameters = reader.parameters();
  for (size_t i = 0; i < parameters.size(); ++i) writer.write(reader.read(parameters[i].first, specs[i].dtype));
  for (const auto& value : buffer_values) writer.write(value);
  writer.commit();
}

}  // namespace fsdp::checkpoint
