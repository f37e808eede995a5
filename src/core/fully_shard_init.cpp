// fully_shard itself (FSDP2's _fsdp_init): which parameters a call takes,
// checked against the units already made, moved into a new unit's flat
// shards, and the tree the listed modules root. What the unit does on each
// call is fsdp_state.cpp's; the run-time API, fully_shard.cpp's.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>

#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/core/memory.h"

#include "core/fsdp_collectives.h"
#include "core/full_precision.h"
#include "core/fsdp_state.h"
#include "core/units.h"

namespace fsdp {
namespace {


// What no unit shards, broadcast from global rank 0 in name order, the same
// on every rank: the buffers of this module's subtree outside the units
// below it (those synced their own), always ([Note: buffers under
// fully_shard]); its ignored parameters under sync_module_states.
//
// [Note: buffers under fully_shard]
// Every rank holds every buffer whole. fully_shard starts them equal, from
// rank 0's, and then leaves them alone: a BatchNorm's running statistics
// follow each rank's own batches and drift apart (a forward in training
// mode normalises by the batch's statistics, so training does not read
// them). A checkpoint saves rank 0's, and a load gives them to every rank.
// Programs that need them equal everywhere call replicate, which
// broadcasts them each forward, or average them themselves.
void sync_unmanaged_states(torch::nn::Module& module,
                           const std::vector<std::pair<std::string, FSDPState*>>& children,
                           const FullyShardOptions& options, const TreeComm& log) {
  const auto inside_child = [&](const std::string& name) {
    for (const auto& [prefix, state] : children) {
      (void)state;
      if (!prefix.empty() && name.rfind(prefix + ".", 0) == 0) return true;
    }
    return false;
  };
  auto& world = options.mesh->world().group();
  if (world.size() == 1) return;
  static const std::string kUnit = "<root>";  // the unit being made is the root of its own tree
  const auto broadcast_in_place = [&](const at::Tensor& t) {
    at::NoGradGuard no_grad;
    at::Tensor buffer = t.detach().contiguous().clone();
    broadcast_from_rank0(UnitComm{world, log.log, log.streams, kUnit}, buffer);
    t.detach().copy_(buffer);
  };
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    if (item.value().defined() && !inside_child(item.key())) broadcast_in_place(item.value());
  }
  if (!options.sync_module_states) return;
  std::unordered_set<const void*> ignored;
  for (const auto& t : options.ignored_params) ignored.insert(tensor_key(t));
  std::unordered_set<const void*> done;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const void* key = tensor_key(item.value());
    if (ignored.count(key) != 0 && !inside_child(item.key()) && done.insert(key).second) {
      broadcast_in_place(item.value());
    }
  }
}



// Refuses, before anything changes, a module listed twice, sharded
// already or replicated.
void check_shardable(const std::vector<torch::nn::Module*>& modules) {
  for (size_t i = 0; i < modules.size(); ++i) {
    torch::nn::Module& module = *modules[i];
    for (size_t j = 0; j < i; ++j) {
      FSDP_CHECK(modules[j] != modules[i], "fully_shard: module ", module.name(), " is listed twice");
    }
    if (FSDPState* existing = detail::state_of(module)) {
      const std::string holds = existing->group() != nullptr
                                    ? " (its parameters start with '" + existing->group()->params().front()->fqn + "')"
                                    : "";
      throw Error("fully_shard: module " + module.name() + holds +
                  " is sharded already; apply fully_shard once per module, children before parents");
    }
    FSDP_CHECK(detail::hooks_of(module) == nullptr, "fully_shard: module ", module.name(),
               " is replicated by replicate; use one of the two (fully_shard with ShardingStrategy::kNoShard is "
               "replication with FSDP's units)");
  }
}

// What a new unit holds: its own parameters, and the units below its
// modules with the names they have from there.
struct UnitContents {
  std::vector<FSDPParam> params;
  std::vector<FSDPState*> below;  // each once
  std::unordered_map<FSDPState*, std::vector<std::string>> below_names;
};

// The parameters of `modules` no unit below holds, refusing one shared
// with another unit; the states outside any unit (buffers, ignored
// parameters) are broadcast, logged in `tree`'s log.
UnitContents collect_unit(const std::vector<torch::nn::Module*>& modules, const FullyShardOptions& options,
                          FSDPTree& tree) {
  const bool several = modules.size() > 1;
  std::unordered_set<const void*> ignored;
  for (const auto& t : options.ignored_params) ignored.insert(tensor_key(t));
  std::unordered_set<const void*> kept_full;
  for (torch::nn::Module* module : modules) kept_full.merge(full_precision_parameters(*module, options.mixed_precision));
  const char* const kOneUnit =
      ": a parameter can belong to one unit only; apply fully_shard to a common ancestor of the modules that "
      "share it (and not to them), shard them together with fully_shard({a, b}), or list it in ignored_params";

  UnitContents out;
  std::vector<FSDPParam>& params = out.params;
  std::unordered_set<const void*> taken;  // tied parameters appear under several names, in several modules
  std::vector<FSDPState*>& below = out.below;
  auto& below_names = out.below_names;
  for (size_t i = 0; i < modules.size(); ++i) {
    torch::nn::Module& module = *modules[i];
    const std::string prefix = several ? "[" + std::to_string(i) + "]" : "";
    // Units below this module, by name; each parameter belongs to the
    // deepest unit whose subtree names it.
    const auto children = unit_modules_under(module);
    for (const auto& [name, child] : children) {
      if (std::find(below.begin(), below.end(), child) == below.end()) below.push_back(child);
      below_names[child].push_back(join_name(prefix, name));
    }
    const auto owner_by_path = [&](const std::string& fqn) -> FSDPState* {
      FSDPState* owner = nullptr;
      size_t best = 0;
      for (const auto& [name, state] : children) {
        if (!name.empty() && fqn.rfind(name + ".", 0) == 0 && name.size() + 1 > best) {
          owner = state;
          best = name.size() + 1;
        }
      }
      return owner;
    };
    // Parameters held by the units below, and where.
    std::unordered_map<const void*, FSDPState*> held_below;
    for (const auto& [name, state] : children) {
      (void)name;
      if (state->group() == nullptr) continue;
      for (const FSDPParam* p : state->group()->params()) held_below[tensor_key(p->param)] = state;
    }
    // Every parameter of its own sharded already, by a unit outside it: most
    // often an ancestor sharded first, which is no sharing at all.
    std::string first_outside;
    size_t own = 0, outside = 0;
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      const void* key = tensor_key(item.value());
      if (ignored.count(key) != 0 || held_below.count(key) != 0 || owner_by_path(item.key()) != nullptr) continue;
      ++own;
      if (memory::is_flat_buffer(item.value())) {
        ++outside;
        if (first_outside.empty()) first_outside = item.key();
      }
    }
    FSDP_CHECK(own == 0 || outside < own, "fully_shard: every parameter of module ", module.name(),
               " is in a unit sharded already ('", join_name(prefix, first_outside),
               "' is one). If that unit is an ancestor's, the ancestor was sharded first: apply fully_shard children "
               "before parents (the blocks first, then their ancestors, the root last). If parameter '",
               join_name(prefix, first_outside), "' is shared with another unit instead", kOneUnit);
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      const std::string& fqn = item.key();
      const at::Tensor& param = item.value();
      const void* key = tensor_key(param);
      if (ignored.count(key) != 0) continue;
      FSDPState* path_owner = owner_by_path(fqn);
      const auto held = held_below.find(key);
      if (held != held_below.end()) {
        // Held by a unit below: fine only if this name is inside that unit too.
        if (held->second != path_owner) {
          // Its name as seen from this module, when its unit is below.
          std::string holder_name;
          for (const FSDPParam* p : held->second->group()->params()) {
            if (tensor_key(p->param) == key) holder_name = p->fqn;
          }
          for (const auto& [name, child] : children) {
            if (child == held->second && !name.empty() && holder_name.rfind(name + ".", 0) != 0) {
              holder_name = join_name(name, holder_name);
              break;
            }
          }
          throw Error("fully_shard: parameter '" + join_name(prefix, fqn) + "' is shared with another unit, which holds it as '" +
                      holder_name + "'" + kOneUnit);
        }
        continue;
      }
      if (path_owner != nullptr) continue;  // a unit below owns this module's parameters by path
      FSDP_CHECK(!memory::is_flat_buffer(param), "fully_shard: parameter '", join_name(prefix, fqn),
                 "' is shared with another unit, outside this module, which has sharded it already", kOneUnit);
      if (!taken.insert(key).second) continue;  // tied within this unit: once
      FSDPParam p;
      p.fqn = join_name(prefix, fqn);
      p.param = param;
      p.full_precision = kept_full.count(key) != 0;
      if (options.shard_placement) {
        if (const std::optional<Shard> placement = options.shard_placement(p.fqn, param)) {
          const int64_t dims = param.dim();
          FSDP_CHECK(placement->dim >= -dims && placement->dim < dims, "fully_shard: shard_placement put parameter '",
                     p.fqn, "' of shape ", param.sizes(), " on Shard(", placement->dim, "): expected a dim in [",
                     -dims, ", ", dims, ")", dims == 0 ? " (a scalar cannot be placed: return nullopt for it)" : "");
          p.shard_dim = placement->dim < 0 ? placement->dim + dims : placement->dim;
        }
      }
      params.push_back(std::move(p));
    }
    sync_unmanaged_states(module, children, options, tree.comm());
  }

  return out;
}

// The listed modules become the root of every unit below them.
void join_units_below(const std::shared_ptr<FSDPTree>& tree, const std::shared_ptr<FSDPState>& state,
                      const std::vector<torch::nn::Module*>& modules, const UnitContents& contents) {
  const bool several = modules.size() > 1;
  const auto& below = contents.below;
  const auto& below_names = contents.below_names;
  // Those units' parameters are renamed from here (first name, tied ones
  // once), so errors and checkpoints name them from the root; a unit of
  // several modules is named by its modules' names joined with '+'.
  std::unordered_map<const void*, std::string> name_here;
  for (size_t i = 0; i < modules.size(); ++i) {
    const std::string prefix = several ? "[" + std::to_string(i) + "]" : "";
    for (const auto& item : modules[i]->named_parameters(/*recurse=*/true)) {
      name_here.emplace(tensor_key(item.value()), join_name(prefix, item.key()));
    }
  }
  std::unordered_map<const FSDPState*, std::string> unit_names;
  for (FSDPState* child : below) {
    std::string& unit_name = unit_names[child];
    for (const auto& n : below_names.at(child)) unit_name += (unit_name.empty() ? "" : "+") + n;
  }
  // The root of a tree made earlier brings that tree's log along, each of
  // its units named as from here.
  for (FSDPState* child : below) {
    if (!child->is_root()) continue;
    std::unordered_map<std::string, std::string> renamed;
    for (const FSDPState* unit : child->tree()->units()) {
      const auto it = unit_names.find(unit);
      if (it != unit_names.end()) renamed.emplace(unit->name(), it->second);
    }
    tree->log().adopt(child->tree()->log(), renamed);
  }
  tree->add(state.get());
  state->join_tree(tree, true, "");
  for (FSDPState* child : below) {
    const std::string& unit_name = unit_names[child];
    tree->add(child);
    child->join_tree(tree, false, unit_name);
    if (child->group() == nullptr) continue;
    for (FSDPParam* p : child->group()->params()) {
      const auto it = name_here.find(tensor_key(p->param));
      if (it != name_here.end()) p->fqn = it->second;
    }
  }
}

// fully_shard on one module or on several as one unit. With several, names
// are "[i].<name in module i>" until an ancestor is sharded and renames the
// unit's parameters from itself.
void shard_unit(const std::vector<torch::nn::Module*>& modules, const FullyShardOptions& options) {
  validate(options);
  FSDP_CHECK(!modules.empty(), "fully_shard: the list of modules is empty");
  check_shardable(modules);
  // The tree the listed modules root; its log holds the start-up
  // broadcasts from here on.
  auto tree = std::make_shared<FSDPTree>();
  UnitContents contents = collect_unit(modules, options, *tree);
  std::unique_ptr<FSDPParamGroup> group;
  if (!contents.params.empty()) {
    group = std::make_unique<FSDPParamGroup>(std::move(contents.params), *options.mesh, options, tree->comm());
  }
  auto state = std::make_shared<FSDPState>(std::move(group), options);
  if (modules.size() > 1) state->set_modules({modules.begin(), modules.end()});
  join_units_below(tree, state, modules, contents);
  for (torch::nn::Module* module : modules) attach_unit_state(*module, state, module->name());
}

}  // namespace

void fully_shard(torch::nn::Module& module, const FullyShardOptions& options) { shard_unit({&module}, options); }

void fully_shard(const std::vector<torch::nn::Module*>& modules, const FullyShardOptions& options) {
  shard_unit(modules, options);
}

}  // namespace fsdp
