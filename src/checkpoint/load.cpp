// Load: check the parts match the checkpoint, plan this rank's reads, read
// each file once as it streams past, then set the optimizers' state, their
// hyperparameters, the states and the random stream.
#include "fsdp/checkpoint/checkpoint.h"

#include <algorithm>
#include <exception>
#include <functional>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "checkpoint/agreement.h"
#include "checkpoint/contents.h"
#include "checkpoint/rank_files.h"
#include "fsdp/checkpoint/optimizer_state.h"
#include "fsdp/common/compat.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/io/safetensors.h"

namespace fsdp::checkpoint {

namespace {

using detail::Contents;
using detail::contents_of;
using detail::FileCopy;
using detail::for_each_piece;
using detail::kBufferFileRank;
using detail::RankFiles;
using detail::ranks_that_failed;
using detail::saved_optimizers;
using detail::SavedOptimizer;

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
      plan.converted.emplace_back(
          [&files, rank, tensor, lo, pb, hi, to] { to.copy_(files.get(rank).read_range(tensor, lo - pb, hi - lo)); });
    }
  });
}

// Everything a load checks before it reads a byte: the same parameters
// with the same shapes, the same buffers, optimizers of the same kinds over
// the same parameter groups, and every named state. Throws naming the part
// and both sides.
void check_parts_match(const std::string& checkpoint, const nlohmann::json& meta, const Contents& c, const Parts& parts,
                       const std::map<std::string, SavedOptimizer>& saved) {
  const auto& params = meta["params"];
  const bool left_out = meta.value("frozen_left_out", false);
  FSDP_CHECK(!left_out || c.frozen_left_out, "checkpoint '", checkpoint, "' holds the trainable parameters alone ",
             "(its frozen ones, a LoRA run's base, are rebuilt by the program that saved it); load it with parts ",
             "that leave the frozen ones out too (Parts::leave_out_frozen), into a model built as that program's was");
  for (const auto& s : c.shards) {
    FSDP_CHECK(params.contains(s.fqn), "checkpoint '", checkpoint, "' is from another model: it has no parameter '",
               s.fqn, "'");
    const auto shape = params[s.fqn]["shape"].get<std::vector<int64_t>>();
    FSDP_CHECK(shape == s.shape, "checkpoint '", checkpoint, "' is from another model or config: parameter '", s.fqn,
               "' was saved with shape ", c10::IntArrayRef(shape), ", this model has ", c10::IntArrayRef(s.shape));
  }
  // A key the program lacks, named as every other mismatch is. Parts that
  // leave their frozen parameters out read theirs from a full checkpoint.
  if (params.size() != c.shards.size() && !(c.frozen_left_out && !left_out)) {
    std::set<std::string> mine;
    for (const auto& s : c.shards) mine.insert(s.fqn);
    for (const auto& [fqn, unused] : params.items()) {
      FSDP_CHECK(mine.count(fqn) != 0, "checkpoint '", checkpoint, "' holds parameter '", fqn,
                 "', which this model has not (", params.size(), " parameters there, ", c.shards.size(),
                 " here): it is from another model");
    }
  }
  FSDP_CHECK(params.size() == c.shards.size() || (c.frozen_left_out && !left_out), "checkpoint '", checkpoint, "' holds ", params.size(),
             " parameters, this model ", c.shards.size(), ": it is from another model");
  if (meta.contains("buffers")) {  // versions 1 and 2 saved none
    const auto& buffers = meta["buffers"];
    for (const auto& [fqn, value] : c.buffers) {
      FSDP_CHECK(buffers.contains(fqn), "checkpoint '", checkpoint, "' has no buffer '", fqn,
                 "', which this model has: it is from another model");
      const auto shape = buffers[fqn]["shape"].get<std::vector<int64_t>>();
      FSDP_CHECK(shape == value.sizes().vec(), "checkpoint '", checkpoint, "': buffer '", fqn,
                 "' was saved with shape ", c10::IntArrayRef(shape), ", this model has ", value.sizes());
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
      const nlohmann::json whole =
          nlohmann::json::array({{{"rank", kBufferFileRank}, {"begin", 0}, {"count", value.numel()}}});
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
          plan_range(files, params[s.fqn]["shards"], from.tensor_name(o.name, tensor, s.fqn), s.begin, value.view({-1}),
                     o.name + " '" + tensor + "' of '" + s.fqn + "'", plan);
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
  FSDP_CHECK(entry != nullptr && entry->dtype == expected.scalar_type() && entry->shape == expected.sizes().vec(), "'",
             own.path(), "': its random state 'rng/cpu' is ",
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

}  // namespace fsdp::checkpoint
