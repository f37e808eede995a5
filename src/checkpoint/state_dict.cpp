#include "fsdp/checkpoint/state_dict.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "fsdp/checkpoint/optimizer_state.h"
#include "fsdp/common/compat.h"
#include "fsdp/common/error.h"
#include "fsdp/common/error_text.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/io/safetensors.h"

namespace fsdp::checkpoint {

std::vector<std::pair<std::string, at::Tensor>> full_state_dict(torch::nn::Module& root) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, value] : full_parameters(root)) out.emplace_back(name, value.detach().to(at::kCPU).contiguous());
  for (const auto& item : root.named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) out.emplace_back(item.key(), item.value().detach().to(at::kCPU).contiguous());
  }
  return out;
}

namespace {

// Rank 0 writes `tensors` to `path` (safetensors, atomically); every rank
// learns whether it did, and throws naming `what` when it did not.
void write_on_rank_zero(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata, const std::string& what,
                        dist::World& world) {
  std::string error;
  if (world.rank() == 0) {
    try {
      std::vector<io::SafetensorsWriter::Spec> specs;
      for (const auto& [name, t] : tensors) specs.push_back({name, t.scalar_type(), t.sizes().vec()});
      io::SafetensorsWriter writer(path, specs, metadata);
      for (const auto& [name, t] : tensors) writer.write(t.contiguous());
      writer.commit();
    } catch (const std::exception& e) {
      error = error_text(e);
    }
  }
  at::Tensor failed = at::full({1}, error.empty() ? 0 : 1, at::kInt);
  dist::broadcast(world.group(), failed, 0).wait();
  FSDP_CHECK(failed.item<int>() == 0, "saving the ", what, " to '", path, "' failed on rank 0",
             error.empty() ? std::string() : ": " + error);
}

}  // namespace

void save_full_state_dict(torch::nn::Module& root, const std::string& path, dist::World& world) {
  write_on_rank_zero(path, full_state_dict(root), {}, "full state dict", world);
}

void load_full_state_dict(torch::nn::Module& root, const std::string& path) {
  const io::SafetensorsFile file(path);
  const auto shards = local_shards(root);
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  for (const auto& item : root.named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) buffers.emplace_back(item.key(), item.value());
  }
  // Every check before any write: a refused file changes nothing.
  std::set<std::string> expected;
  const auto check = [&](const std::string& name, const std::vector<int64_t>& shape) {
    expected.insert(name);
    const auto* entry = file.find(name);
    FSDP_CHECK(entry != nullptr, "state dict '", path, "' has no '", name, "', which the module has (shape ",
               c10::IntArrayRef(shape), ")");
    FSDP_CHECK(entry->shape == shape, "state dict '", path, "': '", name, "' has shape ",
               c10::IntArrayRef(entry->shape), ", the module's is ", c10::IntArrayRef(shape));
  };
  for (const auto& s : shards) check(s.fqn, s.shape);
  for (const auto& [name, value] : buffers) check(name, value.sizes().vec());
  for (const auto& e : file.entries()) {
    FSDP_CHECK(expected.count(e.name) != 0, "state dict '", path, "' holds '", e.name, "' (shape ",
               c10::IntArrayRef(e.shape), "), which the module does not have");
  }
  at::NoGradGuard no_grad;
  for (const auto& s : shards) {
    if (s.numel > 0) s.local.copy_(file.read_range(s.fqn, s.begin, s.numel));
  }
  for (const auto& [name, value] : buffers) value.detach().copy_(file.view(name));
}

namespace {

constexpr const char* kOptimizerMetadataKey = "fsdp.optimizer";

// The module's shards, and each of the optimizer's parameters as an index
// into them, group by group.
struct OptimizerLayout {
  std::vector<LocalShard> shards;
  std::vector<std::vector<size_t>> groups;
};

OptimizerLayout layout_of(torch::nn::Module& root, torch::optim::Optimizer& optimizer) {
  OptimizerLayout layout;
  layout.shards = local_shards(root);
  std::unordered_map<const void*, size_t> index;
  for (size_t i = 0; i < layout.shards.size(); ++i) index[layout.shards[i].param.unsafeGetTensorImpl()] = i;
  for (const auto& group : optimizer.param_groups()) {
    auto& indices = layout.groups.emplace_back();
    for (const auto& p : group.params()) {
      const auto it = index.find(p.unsafeGetTensorImpl());
      FSDP_CHECK(it != index.end(), "optimizer state dict: the optimizer steps a parameter of shape ", p.sizes(),
                 " that the module does not hold (create the optimizer after fully_shard, over the module's "
                 "parameters)");
      indices.push_back(it->second);
    }
  }
  return layout;
}

// Whether this rank writes its range of the parameter (one replica does).
bool writes(const LocalShard& s, int rank) { return (s.sharded ? s.replica == 0 : rank == 0) && s.numel > 0; }

}  // namespace

FullOptimizerState full_optimizer_state_dict(torch::nn::Module& root, torch::optim::Optimizer& optimizer,
                                             dist::World& world) {
  const std::string kind = optimizer_kind(optimizer);
  const OptimizerLayout layout = layout_of(root, optimizer);
  const auto& names = optimizer_state_tensors(kind);
  std::vector<size_t> order;
  for (const auto& group : layout.groups) order.insert(order.end(), group.begin(), group.end());
  // Which parameters have state, their steps, whether a state tensor is
  // shaped unlike its parameter, and which tensors (a column each), agreed
  // on by every rank (a rank whose shard is empty holds state of no
  // elements) before any rank can refuse.
  const auto n = static_cast<int64_t>(order.size());
  constexpr int64_t kHas = 0, kStep = 1, kBad = 2, kTensors = 3;
  at::Tensor table = at::zeros({n, kTensors + static_cast<int64_t>(names.size())}, at::kLong);
  std::vector<ParamState> local(order.size());
  auto& states = optimizer.state();
  for (int64_t k = 0; k < n; ++k) {
    const LocalShard& s = layout.shards[order[static_cast<size_t>(k)]];
    const auto it = states.find(compat::optimizer_state_key(s.param));
    if (it == states.end()) continue;
    local[static_cast<size_t>(k)] = read_param_state(kind, *it->second);
    table[k][kHas] = 1;
    table[k][kStep] = local[static_cast<size_t>(k)].step;
    for (const auto& [tensor, value] : local[static_cast<size_t>(k)].tensors) {
      table[k][kTensors + (std::find(names.begin(), names.end(), tensor) - names.begin())] = 1;
      if (value.numel() != s.param.numel()) table[k][kBad] = 1;
    }
  }
  table = table.to(world.device());
  dist::all_reduce(world.group(), table, dist::ReduceOp::kMax).wait();
  table = table.cpu();
  for (int64_t k = 0; k < n; ++k) {
    FSDP_CHECK(table[k][kBad].item<int64_t>() == 0, "optimizer state dict: the optimizer holds state for '",
               layout.shards[order[static_cast<size_t>(k)]].fqn,
               "' shaped unlike the parameter: only state shaped like its parameter is gathered");
  }

  FullOptimizerState out;
  nlohmann::json groups = nlohmann::json::array();
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    nlohmann::json fqns = nlohmann::json::array();
    for (size_t i : layout.groups[g]) fqns.push_back(layout.shards[i].fqn);
    groups.push_back({{"options", group_options(kind, optimizer.param_groups()[g].options())}, {"params", fqns}});
  }
  nlohmann::json saved_state = nlohmann::json::object();
  for (int64_t k = 0; k < n; ++k) {
    if (table[k][kHas].item<int64_t>() == 0) continue;
    const LocalShard& s = layout.shards[order[static_cast<size_t>(k)]];
    nlohmann::json held = nlohmann::json::array();
    for (size_t b = 0; b < names.size(); ++b) {
      if (table[k][kTensors + static_cast<int64_t>(b)].item<int64_t>() == 0) continue;
      held.push_back(names[b]);
      // Whole: each element from the one rank that writes it, zeros from
      // the rest, summed.
      at::Tensor whole = at::zeros({c10::multiply_integers(s.shape)}, s.param.options().device(world.device()));
      for (const auto& [tensor, value] : local[static_cast<size_t>(k)].tensors) {
        if (tensor == names[b] && writes(s, world.rank())) whole.narrow(0, s.begin, s.numel).copy_(value.reshape({-1}));
      }
      dist::all_reduce(world.group(), whole, dist::ReduceOp::kSum).wait();
      out.tensors.emplace_back(names[b] + "/" + s.fqn, whole.view(s.shape).cpu());
    }
    saved_state[s.fqn] = {{"step", table[k][kStep].item<int64_t>()}, {"tensors", held}};
  }
  out.description = {{"kind", kind}, {"groups", groups}, {"state", saved_state}};
  return out;
}

void save_full_optimizer_state_dict(torch::nn::Module& root, torch::optim::Optimizer& optimizer,
                                    const std::string& path, dist::World& world) {
  const FullOptimizerState state = full_optimizer_state_dict(root, optimizer, world);
  write_on_rank_zero(path, state.tensors, {{kOptimizerMetadataKey, state.description.dump()}},
                     "optimizer state dict", world);
}

void load_full_optimizer_state_dict(torch::nn::Module& root, torch::optim::Optimizer& optimizer,
                                    const std::string& path) {
  const io::SafetensorsFile file(path);
  const std::string where = "optimizer state dict '" + path + "'";
  const auto meta = file.metadata().find(kOptimizerMetadataKey);
  FSDP_CHECK(meta != file.metadata().end(), where, " has no '", kOptimizerMetadataKey,
             "' metadata: not a file save_full_optimizer_state_dict wrote");
  const std::string kind = optimizer_kind(optimizer);
  const OptimizerLayout layout = layout_of(root, optimizer);
  std::map<std::string, const LocalShard*> by_name;
  for (const auto& s : layout.shards) by_name[s.fqn] = &s;
  // Every check, every read and every new state, before anything changes.
  std::vector<std::pair<const LocalShard*, std::unique_ptr<torch::optim::OptimizerParamState>>> loaded;
  std::vector<nlohmann::json> options;
  try {
    const nlohmann::json description = nlohmann::json::parse(meta->second);
    const std::string saved_kind = description.at("kind").get<std::string>();
    FSDP_CHECK(saved_kind == kind, where, " was saved from ", saved_kind, ", this optimizer is ", kind);
    const auto& groups = description.at("groups");
    FSDP_CHECK(groups.is_array() && groups.size() == layout.groups.size(), where, " holds ", groups.size(),
               " parameter group(s), this optimizer ", layout.groups.size());
    for (size_t g = 0; g < layout.groups.size(); ++g) {
      std::vector<std::string> own;
      for (size_t i : layout.groups[g]) own.push_back(layout.shards[i].fqn);
      const auto saved = groups[g].at("params").get<std::vector<std::string>>();
      FSDP_CHECK(saved == own, where, ": group ", g, " holds ", nlohmann::json(saved).dump(), ", this optimizer's ",
                 nlohmann::json(own).dump());
      options.push_back(groups[g].at("options"));
      // Checked on a copy: a refused file changes nothing.
      auto trial = optimizer.param_groups()[g].options().clone();
      set_group_options(kind, *trial, options.back(), where + " group " + std::to_string(g));
    }
    for (const auto& [fqn, entry] : description.at("state").items()) {
      const auto found = by_name.find(fqn);
      FSDP_CHECK(found != by_name.end(), where, " holds state for '", fqn, "', which the module does not have");
      const LocalShard& s = *found->second;
      ParamState state;
      state.step = entry.at("step").get<int64_t>();
      for (const auto& tensor : entry.at("tensors").get<std::vector<std::string>>()) {
        const std::string name = tensor + "/" + fqn;
        const auto* e = file.find(name);
        FSDP_CHECK(e != nullptr, where, " lists '", name, "' but does not hold it");
        FSDP_CHECK(e->shape == s.shape, where, ": '", name, "' has shape ", c10::IntArrayRef(e->shape),
                   ", the parameter's is ", c10::IntArrayRef(s.shape));
        at::Tensor value = at::empty_like(s.param);
        if (s.numel > 0) value.view({-1}).copy_(file.read_range(name, s.begin, s.numel));
        state.tensors.emplace_back(tensor, value);
      }
      loaded.emplace_back(&s, make_param_state(kind, state));  // refuses a tensor the kind does not hold
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": its '" + kOptimizerMetadataKey + "' metadata is not what save_full_optimizer_state_dict " +
                "writes (" + e.what() + ")");
  }
  auto& states = optimizer.state();
  for (const auto& group : layout.groups) {
    for (size_t i : group) states.erase(compat::optimizer_state_key(layout.shards[i].param));
  }
  for (auto& [shard, state] : loaded) states[compat::optimizer_state_key(shard->param)] = std::move(state);
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    set_group_options(kind, optimizer.param_groups()[g].options(), options[g], where + " group " + std::to_string(g));
  }
}

}  // namespace fsdp::checkpoint
