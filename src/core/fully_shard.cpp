#include "fsdp/core/fully_shard.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>

#include "fsdp/common/error.h"
#include "fsdp/core/memory.h"
#include "fsdp/dist/collectives.h"

#include "core/fsdp_state.h"

namespace fsdp {
namespace {

// A unit's state belongs to its module, as FSDP2 keeps it on the module
// object: LibTorch modules have no attribute slots, so it hangs from a child
// module with no parameters or buffers, and goes when the module goes.
constexpr const char* kStateChild = "_fsdp";

struct UnitStateHolder : torch::nn::Module {
  UnitStateHolder(std::shared_ptr<FSDPState> s, std::string unit) : state(std::move(s)), unit_name(std::move(unit)) {}
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& /*device*/) const override {
    throw Error("clone: a module with fully_shard applied cannot be cloned (its parameters are shards of "
                "buffers it shares with its unit); clone the model before sharding it");
  }
  // Module::to converts children before parameters, and this holder is its
  // module's first child: a conversion that would move the unit's
  // parameters off their shards is refused before anything changes. One to
  // the parameters' own device and dtype does nothing and is let through.
  void to(torch::Device device, torch::Dtype dtype, bool /*non_blocking*/) override { check_to(&device, &dtype); }
  void to(torch::Dtype dtype, bool /*non_blocking*/) override { check_to(nullptr, &dtype); }
  void to(torch::Device device, bool /*non_blocking*/) override { check_to(&device, nullptr); }
  // torch::save and torch::load of a sharded module would write, and read
  // back into any module, this rank's 1-D shards. Module::save and load ask
  // each child whether it is serializable before writing or reading it,
  // after the module's own parameters, and this holder is the first child:
  // the save is refused before anything reaches the disk, the load before
  // any child changes (a parameter registered on the unit module itself,
  // outside every child, has been read by then).
  bool is_serializable() const override {
    throw Error("torch::save / torch::load: " + unit_name + " is sharded by fully_shard, and its parameters hold "
                "this rank's shards only. Save its whole state with fsdp::checkpoint::save_full_state_dict (one "
                "safetensors file an unsharded module loads) and load whole weights with load_full_state_dict; "
                "for a resumable sharded checkpoint, fsdp::checkpoint::save and load");
  }

  std::shared_ptr<FSDPState> state;
  std::string unit_name;

 private:
  void check_to(const torch::Device* device, const torch::Dtype* dtype) const {
    if (state->group() == nullptr) return;
    const auto& params = state->group()->params();
    const bool unchanged = std::all_of(params.begin(), params.end(), [&](const FSDPParam* fp) {
      const at::Tensor& p = fp->param;
      const bool same_device = device == nullptr || (device->type() == p.device().type() &&
                                                     (!device->has_index() || device->index() == p.device().index()));
      return same_device && (dtype == nullptr || *dtype == p.scalar_type());
    });
    if (unchanged) return;
    std::ostringstream target;
    if (device != nullptr) target << *device;
    if (device != nullptr && dtype != nullptr) target << ", ";
    if (dtype != nullptr) target << *dtype;
    throw Error("to(" + target.str() + "): module " + unit_name +
                " is sharded by fully_shard, and converting it would detach its parameters from their shards; "
                "its parameters were not converted. Convert the module before sharding it (module->to(...), then "
                "fully_shard)");
  }
};

const void* key_of(const at::Tensor& t) { return t.unsafeGetTensorImpl(); }

// Modules in `module`'s subtree (itself included) that belong to a unit,
// with their names relative to it. A unit of several modules appears once
// per module.
std::vector<std::pair<std::string, FSDPState*>> unit_modules_under(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, FSDPState*>> out;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    if (FSDPState* s = detail::state_of(*item.value())) out.emplace_back(item.key(), s);
  }
  return out;
}

// Units in `module`'s subtree, each once, under the name of its first module.
std::vector<std::pair<std::string, FSDPState*>> units_under(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, FSDPState*>> out;
  std::unordered_set<FSDPState*> seen;
  for (auto& [name, state] : unit_modules_under(module)) {
    if (seen.insert(state).second) out.emplace_back(std::move(name), state);
  }
  return out;
}

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

void validate_options(const FullyShardOptions& o) {
  FSDP_CHECK(o.mesh != nullptr, "fully_shard: FullyShardOptions::mesh is not set: build one with fsdp::make_mesh");
  FSDP_CHECK(o.prefetch_depth >= 0, "fully_shard: prefetch_depth ", o.prefetch_depth, ": expected >= 0");
  const auto& layout = o.mesh->layout();
  FSDP_CHECK(o.strategy != ShardingStrategy::kNoShard || layout.shard == 1,
             "fully_shard: no_shard replicates every parameter, so the mesh must have shard size 1; it has ",
             layout.shard, " (use fsdp::make_mesh(world, ShardingStrategy::kNoShard))");
  // Before any parameter moves into a shard (FSDPState checks it again, for the setter).
  if (o.reshard_after_forward) FSDPState::check_reshard_after_forward(*o.reshard_after_forward, layout.shard);
}

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
                           const FullyShardOptions& options) {
  const auto inside_child = [&](const std::string& name) {
    for (const auto& [prefix, state] : children) {
      (void)state;
      if (!prefix.empty() && name.rfind(prefix + ".", 0) == 0) return true;
    }
    return false;
  };
  auto& world = options.mesh->world().group();
  if (world.size() == 1) return;
  const auto broadcast_in_place = [&](const at::Tensor& t) {
    at::NoGradGuard no_grad;
    at::Tensor buffer = t.detach().contiguous().clone();
    dist::broadcast(world, buffer, 0).wait();
    t.detach().copy_(buffer);
  };
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    if (item.value().defined() && !inside_child(item.key())) broadcast_in_place(item.value());
  }
  if (!options.sync_module_states) return;
  std::unordered_set<const void*> ignored;
  for (const auto& t : options.ignored_params) ignored.insert(key_of(t));
  std::unordered_set<const void*> done;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const void* key = key_of(item.value());
    if (ignored.count(key) != 0 && !inside_child(item.key()) && done.insert(key).second) {
      broadcast_in_place(item.value());
    }
  }
}

}  // namespace

namespace detail {

FSDPState* state_of(const torch::nn::Module& module) {
  const auto children = module.named_children();
  const auto* child = children.find(kStateChild);
  if (child == nullptr) return nullptr;
  const auto* holder = (*child)->as<UnitStateHolder>();
  return holder != nullptr ? holder->state.get() : nullptr;
}

CallScope::CallScope(FSDPState& state, const torch::nn::Module& module) : state_(state) { state.pre_forward(module); }

CallScope::~CallScope() {
  if (!finished_) state_.on_forward_error();  // the forward threw
}

at::Tensor CallScope::cast(const at::Tensor& input) const { return state_.cast_input(input); }

void CallScope::wrap_inputs(const std::vector<at::Tensor*>& inputs) { state_.wrap_inputs(inputs); }

void CallScope::finish_tensors(std::vector<at::Tensor>& outputs) {
  finished_ = true;
  state_.post_forward(outputs);
}

void explain_forward_error(const torch::nn::Module& module, const c10::Error& error) {
  // Read as a unit called around its hooks only when the message points at
  // one of its shards (LibTorch's shape errors print the size of the 1-D
  // shard it was handed, an empty one, or "1-D" where a matrix was
  // expected): an out-of-memory or a shape error of a unit called properly
  // goes on as LibTorch threw it.
  std::string what = error.what_without_backtrace();
  what = what.substr(0, what.find('\n'));
  std::unordered_set<int64_t> numbers;
  for (size_t i = 0; i < what.size();) {
    if (!std::isdigit(static_cast<unsigned char>(what[i]))) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < what.size() && std::isdigit(static_cast<unsigned char>(what[end]))) ++end;
    if (end - i < 19) numbers.insert(std::stoll(what.substr(i, end - i)));
    i = end;
  }
  const bool empty_tensor_named = what.find("[0]") != std::string::npos || what.find("(0)") != std::string::npos;
  const bool vector_named = what.find("1-D") != std::string::npos || what.find("1D") != std::string::npos;
  std::string sharded;
  for (const auto& child : module.modules(/*include_self=*/false)) {
    const FSDPState* s = state_of(*child);
    if (s == nullptr || s->group() == nullptr || s->group()->sharded_state() != ShardedState::kSharded) continue;
    const auto& params = s->group()->params();
    // A shard is told from the parameter itself when it is a slice, empty
    // (a rank may hold none of a parameter), or a matrix flattened; a
    // whole vector looks the same sharded or not.
    const bool named = std::any_of(params.begin(), params.end(), [&](const FSDPParam* p) {
      const int64_t n = p->param.numel();
      if (n == 0) return empty_tensor_named;
      if (p->shape.size() >= 2 && vector_named) return true;  // "got 1-D tensor": a flattened matrix
      return numbers.count(n) > 0 && (n != p->numel || p->shape.size() >= 2);
    });
    if (named) sharded += (sharded.empty() ? "" : ", ") + s->name();
  }
  if (sharded.empty()) return;
  throw Error(concat(
      "the forward of ", module.name(), " failed: ", what, "\n  It read the 1-D shards of units under it, not their ",
      "parameters: ", sharded, " (sharded at that moment). A sharded module called as block->forward(x), or as ",
      "block(x) through a TORCH_MODULE holder, skips FSDP's hooks and reads its shards: call it as ",
      "fsdp::call(block, x), or declare its holder with FSDP_MODULE(Block) instead of TORCH_MODULE(Block) ",
      "(fsdp/core/module_holder.h) so that block(x) gathers it"));
}

}  // namespace detail

namespace {

// fully_shard on one module or on several as one unit. With several, names
// are "[i].<name in module i>" until an ancestor is sharded and renames the
// unit's parameters from itself.
void shard_unit(const std::vector<torch::nn::Module*>& modules, const FullyShardOptions& options) {
  validate_options(options);
  FSDP_CHECK(!modules.empty(), "fully_shard: the list of modules is empty");
  const bool several = modules.size() > 1;
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
  }

  std::unordered_set<const void*> ignored;
  for (const auto& t : options.ignored_params) ignored.insert(key_of(t));
  const char* const kOneUnit =
      ": a parameter can belong to one unit only; apply fully_shard to a common ancestor of the modules that "
      "share it (and not to them), shard them together with fully_shard({a, b}), or list it in ignored_params";

  std::vector<FSDPParam> params;
  std::unordered_set<const void*> taken;  // tied parameters appear under several names, in several modules
  std::vector<FSDPState*> below;          // units below the listed modules, each once
  std::unordered_map<FSDPState*, std::vector<std::string>> below_names;
  for (size_t i = 0; i < modules.size(); ++i) {
    torch::nn::Module& module = *modules[i];
    const std::string prefix = several ? "[" + std::to_string(i) + "]" : "";
    // Units below this module, by name; each parameter belongs to the
    // deepest unit whose subtree names it.
    const auto children = unit_modules_under(module);
    for (const auto& [name, child] : children) {
      if (std::find(below.begin(), below.end(), child) == below.end()) below.push_back(child);
      below_names[child].push_back(join(prefix, name));
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
      for (const FSDPParam* p : state->group()->params()) held_below[key_of(p->param)] = state;
    }
    // Every parameter of its own sharded already, by a unit outside it: most
    // often an ancestor sharded first, which is no sharing at all.
    std::string first_outside;
    size_t own = 0, outside = 0;
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      const void* key = key_of(item.value());
      if (ignored.count(key) != 0 || held_below.count(key) != 0 || owner_by_path(item.key()) != nullptr) continue;
      ++own;
      if (memory::is_flat_buffer(item.value())) {
        ++outside;
        if (first_outside.empty()) first_outside = item.key();
      }
    }
    FSDP_CHECK(own == 0 || outside < own, "fully_shard: every parameter of module ", module.name(),
               " is in a unit sharded already ('", join(prefix, first_outside),
               "' is one). If that unit is an ancestor's, the ancestor was sharded first: apply fully_shard children "
               "before parents (the blocks first, then their ancestors, the root last). If parameter '",
               join(prefix, first_outside), "' is shared with another unit instead", kOneUnit);
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      const std::string& fqn = item.key();
      const at::Tensor& param = item.value();
      const void* key = key_of(param);
      if (ignored.count(key) != 0) continue;
      FSDPState* path_owner = owner_by_path(fqn);
      const auto held = held_below.find(key);
      if (held != held_below.end()) {
        // Held by a unit below: fine only if this name is inside that unit too.
        if (held->second != path_owner) {
          // Its name as seen from this module, when its unit is below.
          std::string holder_name;
          for (const FSDPParam* p : held->second->group()->params()) {
            if (key_of(p->param) == key) holder_name = p->fqn;
          }
          for (const auto& [name, child] : children) {
            if (child == held->second && !name.empty() && holder_name.rfind(name + ".", 0) != 0) {
              holder_name = join(name, holder_name);
              break;
            }
          }
          throw Error("fully_shard: parameter '" + join(prefix, fqn) + "' is shared with another unit, which holds it as '" +
                      holder_name + "'" + kOneUnit);
        }
        continue;
      }
      if (path_owner != nullptr) continue;  // a unit below owns this module's parameters by path
      FSDP_CHECK(!memory::is_flat_buffer(param), "fully_shard: parameter '", join(prefix, fqn),
                 "' is shared with another unit, outside this module, which has sharded it already", kOneUnit);
      if (!taken.insert(key).second) continue;  // tied within this unit: once
      FSDPParam p;
      p.fqn = join(prefix, fqn);
      p.param = param;
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
    sync_unmanaged_states(module, children, options);
  }

  std::unique_ptr<FSDPParamGroup> group;
  if (!params.empty()) group = std::make_unique<FSDPParamGroup>(std::move(params), *options.mesh, options);
  auto state = std::make_shared<FSDPState>(std::move(group), options);
  if (several) state->set_modules({modules.begin(), modules.end()});

  // The listed modules become the root of every unit below them. Those
  // units' parameters are renamed from here (first name, tied ones once),
  // so errors and checkpoints name them from the root; a unit of several
  // modules is named by its modules' names joined with '+'.
  std::unordered_map<const void*, std::string> name_here;
  for (size_t i = 0; i < modules.size(); ++i) {
    const std::string prefix = several ? "[" + std::to_string(i) + "]" : "";
    for (const auto& item : modules[i]->named_parameters(/*recurse=*/true)) {
      name_here.emplace(key_of(item.value()), join(prefix, item.key()));
    }
  }
  auto tree = std::make_shared<FSDPTree>();
  tree->states.push_back(state.get());
  state->join_tree(tree, true, "");
  for (FSDPState* child : below) {
    std::string unit_name;
    for (const auto& n : below_names[child]) unit_name += (unit_name.empty() ? "" : "+") + n;
    tree->states.push_back(child);
    child->join_tree(tree, false, unit_name);
    if (child->group() == nullptr) continue;
    for (FSDPParam* p : child->group()->params()) {
      const auto it = name_here.find(key_of(p->param));
      if (it != name_here.end()) p->fqn = it->second;
    }
  }
  for (torch::nn::Module* module : modules) {
    // The holder goes first among the children (see UnitStateHolder::to).
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> others;
    for (const auto& item : module->named_children()) others.emplace_back(item.key(), item.value());
    for (const auto& [name, child] : others) module->unregister_module(name);
    module->register_module(kStateChild, std::make_shared<UnitStateHolder>(state, module->name()));
    for (const auto& [name, child] : others) module->register_module(name, child);
  }
}

}  // namespace

void fully_shard(torch::nn::Module& module, const FullyShardOptions& options) { shard_unit({&module}, options); }

void fully_shard(const std::vector<torch::nn::Module*>& modules, const FullyShardOptions& options) {
  shard_unit(modules, options);
}

bool is_fully_sharded(const torch::nn::Module& module) { return detail::state_of(module) != nullptr; }

std::vector<FSDPEvent> event_log(const torch::nn::Module& root) {
  FSDPState* state = detail::state_of(root);
  FSDP_CHECK(state != nullptr, "event_log: module ", root.name(), " is not sharded");
  return state->tree()->comm.events();
}

void clear_event_log(const torch::nn::Module& root) {
  FSDPState* state = detail::state_of(root);
  FSDP_CHECK(state != nullptr, "clear_event_log: module ", root.name(), " is not sharded");
  state->tree()->comm.clear_events();
}

namespace {
// `module`'s unit and, with `recurse`, every unit below it; `what` names
// the caller in the error for a module that is not sharded.
std::vector<FSDPState*> units_for(torch::nn::Module& module, bool recurse, const char* what) {
  std::vector<FSDPState*> out;
  if (recurse) {
    for (const auto& [name, state] : units_under(module)) {
      (void)name;
      out.push_back(state);
    }
  } else if (FSDPState* s = detail::state_of(module)) {
    out.push_back(s);
  }
  FSDP_CHECK(!out.empty(), what, ": module ", module.name(), " is not sharded",
             recurse ? " and holds no sharded unit" : "", "; apply fully_shard first");
  return out;
}

template <typename Fn>
void for_each_group(torch::nn::Module& module, bool recurse, const char* what, Fn&& fn) {
  for (FSDPState* s : units_for(module, recurse, what)) {
    if (s->group() != nullptr) fn(*s->group());
  }
}
}  // namespace

void set_requires_gradient_sync(torch::nn::Module& module, bool sync, bool recurse) {
  // A replicated module (core/replicate.h) takes the same switch.
  if (detail::set_replicated_gradient_sync(module, sync)) return;
  for_each_group(module, recurse, "set_requires_gradient_sync",
                 [&](FSDPParamGroup& g) { g.set_requires_gradient_sync(sync); });
}

void set_requires_all_reduce(torch::nn::Module& module, bool all_reduce, bool recurse) {
  for_each_group(module, recurse, "set_requires_all_reduce",
                 [&](FSDPParamGroup& g) { g.set_requires_all_reduce(all_reduce); });
}

void set_reshard_after_backward(torch::nn::Module& module, bool reshard, bool recurse) {
  for_each_group(module, recurse, "set_reshard_after_backward",
                 [&](FSDPParamGroup& g) { g.set_reshard_after_backward(reshard); });
}

void set_gradient_divide_factor(torch::nn::Module& module, double factor, bool recurse) {
  FSDP_CHECK(std::isfinite(factor), "set_gradient_divide_factor: factor ", factor, ": expected a finite number");
  for_each_group(module, recurse, "set_gradient_divide_factor", [&](FSDPParamGroup& g) {
    g.set_gradient_divide_factor(factor > 0 ? std::optional<double>(factor) : std::nullopt);
  });
}

void set_all_reduce_hook(torch::nn::Module& module, ReducedGradHook hook, bool recurse) {
  for_each_group(module, recurse, "set_all_reduce_hook",
                 [&](FSDPParamGroup& g) { g.set_reduced_grad_hook(hook); });
}

void set_reshard_after_forward(torch::nn::Module& module, ReshardAfterForward reshard, bool recurse) {
  for (FSDPState* s : units_for(module, recurse, "set_reshard_after_forward")) s->set_reshard_after_forward(reshard);
}

void UnshardHandle::wait() {
  if (group_ != nullptr && group_->epoch() == epoch_) group_->wait_for_unshard();
  group_ = nullptr;
}

UnshardHandle unshard(torch::nn::Module& module, bool async_op) {
  FSDPState* s = detail::state_of(module);
  FSDP_CHECK(s != nullptr, "unshard: module ", module.name(), " is not sharded; apply fully_shard first");
  if (s->group() == nullptr) return UnshardHandle();
  s->group()->unshard();
  UnshardHandle handle(s->group(), s->group()->epoch());
  if (!async_op) handle.wait();
  return handle;
}

void reshard(torch::nn::Module& module) {
  FSDPState* s = detail::state_of(module);
  FSDP_CHECK(s != nullptr, "reshard: module ", module.name(), " is not sharded; apply fully_shard first");
  if (s->group() != nullptr) s->group()->reshard();
}

namespace {
std::vector<FSDPState*> states_of(const std::vector<torch::nn::Module*>& modules, const char* what) {
  std::vector<FSDPState*> out;
  for (auto* m : modules) {
    FSDPState* s = detail::state_of(*m);
    FSDP_CHECK(s != nullptr, what, ": module ", m->name(), " is not sharded; apply fully_shard to it first");
    out.push_back(s);
  }
  return out;
}
}  // namespace

void set_modules_to_forward_prefetch(torch::nn::Module& unit, const std::vector<torch::nn::Module*>& units) {
  FSDPState* s = detail::state_of(unit);
  FSDP_CHECK(s != nullptr, "set_modules_to_forward_prefetch: module ", unit.name(), " is not sharded");
  s->forward_prefetch = states_of(units, "set_modules_to_forward_prefetch");
}

void set_modules_to_backward_prefetch(torch::nn::Module& unit, const std::vector<torch::nn::Module*>& units) {
  FSDPState* s = detail::state_of(unit);
  FSDP_CHECK(s != nullptr, "set_modules_to_backward_prefetch: module ", unit.name(), " is not sharded");
  s->backward_prefetch = states_of(units, "set_modules_to_backward_prefetch");
}

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
      dist::all_gather_into_tensor(g, flat, shard).wait();
      if (flat_shard.reorders()) {
        at::Tensor wire = flat;
        flat = at::empty_like(wire);
        flat_shard.copy_out(wire, flat);
      }
      for (const auto& p : ps) full[key_of(p.param)] = flat.narrow(0, p.offset, p.numel).view(p.shape).clone();
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, param] : unique_named_parameters(root)) {
    const auto it = full.find(key_of(param));
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
      managed[key_of(p->param)] = s;
    }
  }
  std::vector<LocalShard> out;
  for (const auto& [name, param] : unique_named_parameters(root)) {
    LocalShard s;
    const auto it = managed.find(key_of(param));
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
    for (const FSDPParam* p : state->group()->params()) managed[key_of(p->param)] = p->shape;
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& [name, param] : unique_named_parameters(root)) {
    const auto it = managed.find(key_of(param));
    out.emplace_back(name, it != managed.end() ? it->second : param.sizes().vec());
  }
  return out;
}

int64_t sharded_param_bytes(const torch::nn::Module& module) {
  int64_t total = 0;
  for (const auto& [name, state] : units_under(module)) {
    (void)name;
    if (state->group() != nullptr) total += state->group()->sharded_param_bytes();
  }
  return total;
}

std::vector<std::pair<std::string, at::Tensor>> unique_named_parameters(const torch::nn::Module& root) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : root.named_parameters(/*recurse=*/true)) {
    if (seen.insert(key_of(item.value())).second) out.emplace_back(item.key(), item.value());
  }
  return out;
}

std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  for (const auto& [name, param] : unique_named_parameters(module)) out.push_back(param);
  return out;
}

}  // namespace fsdp
