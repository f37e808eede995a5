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
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>

#include "fsdp/common/error.h"
#include "fsdp/common/error_text.h"
#include "fsdp/common/fault_point.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/dist/collectives.h"
#include "fsdp/io/atomic_file.h"
#include "fsdp/io/remove_tree.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/io/streamed_read.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace detail {

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

torch::optim::AdamWParamState* adam_state(torch::optim::AdamW& optimizer, const at::Tensor& param) {
  auto& states = optimizer.state();
  const auto it = states.find(compat::optimizer_state_key(param));
  return it == states.end() ? nullptr : static_cast<torch::optim::AdamWParamState*>(it->second.get());
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

std::optional<std::string> latest(const std::string& dir) {
  std::ifstream in(dir + "/latest");
  if (!in.good()) return std::nullopt;
  std::string name;
  std::getline(in, name);
  const std::string path = dir + "/" + name;
  FSDP_CHECK(!name.empty() && fs::is_directory(path), "'", dir, "/latest' names '", name,
             "', which is not a checkpoint directory");
  return path;
}

namespace {

struct WrittenFile {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
  std::string error;  // why the file could not be written; empty when it was
};

// Save, stage 1: this rank's file (its shards, one replica writing each; its
// AdamW moments; its RNG) into the temporary directory. Returns the table
// rank 0 needs: per parameter (begin, count, writes, adam step).
at::Tensor write_rank_file(const std::string& tmp_dir, const std::vector<LocalShard>& shards,
                           torch::optim::AdamW& optimizer, int rank, WrittenFile& written) {
  std::vector<io::SafetensorsWriter::Spec> specs;
  std::vector<at::Tensor> tensors;
  at::Tensor table = at::zeros({static_cast<int64_t>(shards.size()), 4}, at::kLong);
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto& s = shards[i];
    const bool writes = s.sharded ? s.replica == 0 : rank == 0;
    auto* adam = adam_state(optimizer, s.param);
    table[static_cast<int64_t>(i)][0] = s.begin;
    table[static_cast<int64_t>(i)][1] = s.numel;
    table[static_cast<int64_t>(i)][2] = writes && s.numel > 0 ? 1 : 0;
    table[static_cast<int64_t>(i)][3] = adam != nullptr ? adam->step() : 0;
    if (!writes || s.numel == 0) continue;
    specs.push_back({"model/" + s.fqn, s.local.scalar_type(), {s.numel}});
    tensors.push_back(s.local);
    if (adam != nullptr) {
      for (const auto& [prefix, moment] : {std::pair<const char*, at::Tensor>{"exp_avg/", adam->exp_avg()},
                                           std::pair<const char*, at::Tensor>{"exp_avg_sq/", adam->exp_avg_sq()}}) {
        specs.push_back({prefix + s.fqn, moment.scalar_type(), {s.numel}});
        tensors.push_back(moment.reshape({-1}));
      }
    }
  }
  const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  specs.push_back({"rng/cpu", rng.scalar_type(), rng.sizes().vec()});
  tensors.push_back(rng);
  try {
    io::SafetensorsWriter writer(tmp_dir + "/" + rank_file(rank), specs);
    for (const auto& t : tensors) writer.write(t);
    writer.commit();
    written.bytes = writer.bytes_written();
    written.crc32 = writer.crc32();
  } catch (const std::exception& e) {
    written.error = error_text(e);  // the ranks agree on it before going on
  }
  return table;
}

// Save, stage 2 (rank 0): metadata.json from every rank's table and file.
nlohmann::json build_metadata(const std::vector<LocalShard>& shards, const at::Tensor& all_tables,
                              const at::Tensor& all_files, const TrainerState& state, int w) {
  nlohmann::json params = nlohmann::json::object();
  auto tables = all_tables.view({w, static_cast<int64_t>(shards.size()), 4});
  for (size_t i = 0; i < shards.size(); ++i) {
    nlohmann::json pieces = nlohmann::json::array();
    int64_t adam_step = 0;
    for (int r = 0; r < w; ++r) {
      const auto row = tables[r][static_cast<int64_t>(i)];
      adam_step = std::max(adam_step, row[3].item<int64_t>());
      if (row[2].item<int64_t>() == 1) {
        pieces.push_back({{"rank", r}, {"begin", row[0].item<int64_t>()}, {"count", row[1].item<int64_t>()}});
      }
    }
    params[shards[i].fqn] = {{"shape", shards[i].shape},
                             {"dtype", io::safetensors_dtype_name(shards[i].local.scalar_type())},
                             {"adam_step", adam_step},
                             {"shards", pieces}};
  }
  nlohmann::json files = nlohmann::json::array();
  for (int r = 0; r < w; ++r) {
    files.push_back({{"rank", r},
                     {"name", rank_file(r)},
                     {"bytes", all_files[2 * r].item<int64_t>()},
                     {"crc32", static_cast<uint32_t>(all_files[2 * r + 1].item<int64_t>())}});
  }
  return {{"format", kMetadataFormat},
          {"version", kMetadataVersion},
          {"step", state.step},
          {"world_size", w},
          {"sharding", state.sharding},
          {"mesh", state.mesh},
          {"config", state.config_yaml},
          {"hf_config", state.hf_config},
          {"trainer", {{"tokens_seen", state.tokens_seen}, {"loss_scale", state.loss_scale}}},
          {"extra", state.extra},
          {"params", params},
          {"files", files}};
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
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step_", 0) == 0 && n.find(".tmp") == std::string::npos) steps.push_back(n);
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; keep > 0 && i + static_cast<size_t>(keep) < steps.size(); ++i)
    io::remove_tree(dir + "/" + steps[i]);
}

}  // namespace

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

std::string save(const std::string& dir, int keep, torch::nn::Module& model, torch::optim::AdamW& optimizer,
                 const TrainerState& state, dist::World& world) {
  auto& group = world.group();
  const int rank = world.rank(), w = world.size();
  const std::string name = step_name(state.step);
  const std::string final_dir = dir + "/" + name;
  const std::string tmp_dir = final_dir + ".tmp";
  // Before anything is written: a model that cannot be saved is refused
  // on every rank alike, leaving the folder as it was.
  const auto shards = local_shards(model);
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
  const at::Tensor table = write_rank_file(tmp_dir, shards, optimizer, rank, written);
  agree_on_failure(group, written.error, tmp_dir);

  // Rank 0 learns who holds what, and every file's size and checksum.
  at::Tensor all_tables = at::empty({w * table.numel()}, at::kLong);
  dist::all_gather_into_tensor(group, all_tables, table.view({-1})).wait();
  at::Tensor file_info =
      at::tensor({static_cast<int64_t>(written.bytes), static_cast<int64_t>(written.crc32)}, at::kLong);
  at::Tensor all_files = at::empty({2 * w}, at::kLong);
  dist::all_gather_into_tensor(group, all_files, file_info).wait();

  if (rank == 0) {
    try {
      io::write_file_atomically(tmp_dir + "/metadata.json",
                                sealed_metadata_text(build_metadata(shards, all_tables, all_files, state, w)));
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

// Load: this rank's ranges of every parameter and its AdamW moments; and,
// when each rank maps to one saved, that rank's random state. The
// parameters are written as their files stream past, before the files'
// checksums are known: a failed load leaves them partly loaded (the
// optimizer's state is set only after every file checked out).
at::Tensor read_ranges(const std::string& checkpoint, const nlohmann::json& meta, const std::vector<LocalShard>& shards,
                       torch::optim::AdamW& optimizer, const dist::World& world) {
  const auto& params = meta["params"];
  RankFiles files(checkpoint, meta);
  torch::NoGradGuard no_grad;
  LoadPlan plan;
  std::vector<std::unique_ptr<torch::optim::AdamWParamState>> moments(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto& s = shards[i];
    const auto& entry = params[s.fqn];
    const auto& pieces = entry["shards"];
    plan_range(files, pieces, "model/" + s.fqn, s.begin, s.local, "parameter '" + s.fqn + "'", plan);
    const int64_t adam_step = entry["adam_step"].get<int64_t>();
    if (adam_step == 0) continue;
    auto moment = [&](const char* prefix) {
      // Every element is written: plan_range fails unless the pieces cover it.
      at::Tensor m = at::empty_like(s.param);
      plan_range(files, pieces, prefix + s.fqn, s.begin, m.view({-1}), std::string(prefix) + s.fqn, plan);
      return m;
    };
    moments[i] = std::make_unique<torch::optim::AdamWParamState>();
    moments[i]->step(adam_step);
    moments[i]->exp_avg(moment("exp_avg/"));
    moments[i]->exp_avg_sq(moment("exp_avg_sq/"));
  }
  for (auto& [rank, copies] : plan.streamed) files.stream(rank, copies);
  for (const auto& convert : plan.converted) convert();
  for (size_t i = 0; i < shards.size(); ++i) {
    if (moments[i]) optimizer.state()[compat::optimizer_state_key(shards[i].param)] = std::move(moments[i]);
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

TrainerState load(const std::string& checkpoint, torch::nn::Module& model, torch::optim::AdamW& optimizer,
                  dist::World& world) {
  const nlohmann::json meta = read_metadata(checkpoint);
  const auto shards = local_shards(model);
  const auto& params = meta["params"];
  // The same model: every parameter, with its shape.
  for (const auto& s : shards) {
    FSDP_CHECK(params.contains(s.fqn), "checkpoint '", checkpoint, "' is from another model: it has no parameter '",
               s.fqn, "'");
    const auto saved = params[s.fqn]["shape"].get<std::vector<int64_t>>();
    FSDP_CHECK(saved == s.shape, "checkpoint '", checkpoint, "' is from another model or config: parameter '", s.fqn,
               "' was saved with shape ", c10::IntArrayRef(saved), ", this model has ", c10::IntArrayRef(s.shape));
  }
  FSDP_CHECK(params.size() == shards.size(), "checkpoint '", checkpoint, "' holds ", params.size(),
             " parameters, this model ", shards.size(), ": it is from another model");

  // A rank that cannot read its ranges (a damaged or missing file) must not
  // leave the others waiting in a collective that then fails with a
  // transport error: every rank learns which ranks failed, each of those
  // reports its own cause, and the rest name them.
  std::string failure;
  at::Tensor rng;
  try {
    rng = read_ranges(checkpoint, meta, shards, optimizer, world);
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
  // The random stream continues where it was.
  if (rng.defined()) {
    auto generator = at::detail::getDefaultCPUGenerator();  // a handle to the global generator
    generator.set_state(rng);
  }
  dist::barrier(world.group());
  return trainer_state(meta);
}

std::string damage(const std::string& checkpoint) {
  try {
    const nlohmann::json meta = read_metadata(checkpoint);
    RankFiles files(checkpoint, meta);
    for (const auto& f : meta["files"]) files.get(f["rank"].get<int>());
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
  RankFiles files(checkpoint, meta);
  bool ok = true;
  for (const auto& f : meta["files"]) {
    std::string status = "ok";
    try {
      files.get(f["rank"].get<int>());
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

}  // namespace fsdp::checkpoint
