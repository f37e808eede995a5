// The state-dict side of fully_shard: a tree's parameters whole (gathered
// through fsdp_collectives, so the event log shows them) or as this rank's
// shards, and what a checkpoint records about them.
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>

#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"

#include "core/fsdp_collectives.h"
#include "core/fsdp_state.h"
#include "core/units.h"

namespace fsdp {

std::vector<std::pair<std::string, at::Tensor>> full_parameters(torch::nn::Module& root) {
  // Gather each unit's flat master shard once, in a fixed order on every rank.
  std::unordered_map<const void*, at::Tensor> full;
  for (const auto& [name, state] : units_under(root)) {
    (void)name;
    FSDPParamGroup* group = state->group();
    if (group == nullptr) continue;
    // Between steps only the root can be gathered (after an inference
    // forward); its shard is current, so release the gathered copy.
    group->reshard();
    auto& g = group->shard_group();
    for (size_t i = 0; i < group->num_shards(); ++i) {
      // Each dtype's flat shard as its parameters' sharded views hold it
      // (some may be empty).
      const FlatShard& flat_shard = group->shard(i);
      const auto& ps = flat_shard.params();
      at::Tensor shard = at::zeros({flat_shard.shard_numel()}, ps.front().param.options());
      for (const auto& p : ps) {
        if (p.local.numel > 0) flat_shard.shard_view(shard, p).copy_(p.param.detach());
      }
      at::Tensor flat = at::empty({flat_shard.padded_numel()}, shard.options());
      const TreeComm tree = state->tree()->comm();
      const UnitComm on{g, tree.log, tree.streams, state->name()};
      all_gather(on, shard, flat).wait(on.log, "FSDP::state_dict_gather_wait");
      flat = flat_shard.parameter_major(flat);
      for (const auto& p : ps) full[tensor_key(p.param)] = flat.narrow(0, p.offset, p.numel).view(p.shape).clone();
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, param] : unique_named_parameters(root)) {
    const auto it = full.find(tensor_key(param));
    out.emplace_back(name, it != full.end() ? it->second : param.detach().clone());
  }
  return out;
}

std::vector<LocalShard> local_shards(torch::nn::Module& root) {
  std::unordered_map<const void*, LocalShard> managed;
  for (const auto& [name, state] : units_under(root)) {
    (void)name;
    FSDPParamGroup* group = state->group();
    if (group == nullptr) continue;
    group->reshard();
    const int replica = group->replicate_group().rank();
    for (size_t i = 0; i < group->num_shards(); ++i) {
      const FlatShard& flat_shard = group->shard(i);
      for (const FSDPParam& p : flat_shard.params()) {
        FSDP_CHECK(flat_shard.chunks_are_ranges(p), "parameter '", p.fqn, "' is placed on Shard(", p.shard_dim,
                   ") and its ranks' chunks are not ranges of its flattened elements, which is what "
                   "checkpoints store: place it on Shard(0) (or leave it in the flat layout) to save it");
      }
    }
    for (const FSDPParam* p : group->params()) {
      LocalShard s;
      s.param = p->param;
      // Sharded: the parameter's data is its 1-D slice, or its chunk (one
      // range, checked above).
      s.local = p->param.detach().view({-1});
      s.shape = p->shape;
      s.begin = p->local.begin_in_param;
      s.numel = p->local.numel;
      s.sharded = true;
      s.replica = replica;
      managed[tensor_key(p->param)] = s;
    }
  }
  std::vector<LocalShard> out;
  for (const auto& [name, param] : unique_named_parameters(root)) {
    LocalShard s;
    const auto it = managed.find(tensor_key(param));
    if (it != managed.end()) {
      s = it->second;
    } else {
      s.param = param;
      s.local = param.detach().view({-1});
      s.shape = param.sizes().vec();
      s.numel = param.numel();
    }
    s.fqn = name;
    out.push_back(std::move(s));
  }
  return out;
}

ShardingRecord sharding_of(const torch::nn::Module& root) {
  for (const auto& [name, state] : units_under(root)) {
    (void)name;
    if (state->group() == nullptr) continue;
    const auto& layout = state->group()->mesh().layout();
    return {to_string(state->strategy()), {layout.replicate, layout.shard}};
  }
  return {};
}

std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const torch::nn::Module& root) {
  std::unordered_map<const void*, std::vector<int64_t>> managed;
  for (const auto& [name, state] : units_under(root)) {
    (void)name;
    if (state->group() == nullptr) continue;
    for (const FSDPParam* p : state->group()->params()) managed[tensor_key(p->param)] = p->shape;
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& [name, param] : unique_named_parameters(root)) {
    const auto it = managed.find(tensor_key(param));
    out.emplace_back(name, it != managed.end() ? it->second : param.sizes().vec());
  }
  return out;
}

namespace {

// The sum of `of(group)` over the units under `module`.
template <typename Of>
int64_t sum_over_units(const torch::nn::Module& module, Of&& of) {
  int64_t total = 0;
  for (const auto& [name, state] : units_under(module)) {
    (void)name;
    if (state->group() != nullptr) total += of(*state->group());
  }
  return total;
}

}  // namespace

int64_t sharded_param_bytes(const torch::nn::Module& module) {
  return sum_over_units(module, [](const FSDPParamGroup& g) { return g.sharded_param_bytes(); });
}

int64_t host_param_bytes(const torch::nn::Module& module) {
  return sum_over_units(module, [](const FSDPParamGroup& g) { return g.host_param_bytes(); });
}

}  // namespace fsdp
