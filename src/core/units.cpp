#include "core/units.h"

#include <algorithm>
#include <sstream>
#include <unordered_set>

#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"

#include "core/fsdp_state.h"

namespace fsdp {
namespace {

// A module's call hooks belong to it, as FSDP2 keeps its state on the
// module object: LibTorch modules have no attribute slots, so they hang
// from a child module with no parameters or buffers, and go when the
// module goes.
constexpr const char* kHooksChild = "_fsdp";

struct UnitStateHolder : CallHooksHolder {
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

  detail::CallHooks* hooks() const override { return state.get(); }

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


}  // namespace

void attach_call_hooks(torch::nn::Module& module, std::shared_ptr<CallHooksHolder> holder) {
  FSDP_ASSERT(detail::hooks_of(module) == nullptr);
  // The holder goes first among the children (see UnitStateHolder::to).
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> others;
  for (const auto& item : module.named_children()) others.emplace_back(item.key(), item.value());
  for (const auto& [name, child] : others) module.unregister_module(name);
  module.register_module(kHooksChild, std::move(holder));
  for (const auto& [name, child] : others) module.register_module(name, child);
}

void attach_unit_state(torch::nn::Module& module, std::shared_ptr<FSDPState> state, const std::string& unit_name) {
  attach_call_hooks(module, std::make_shared<UnitStateHolder>(std::move(state), unit_name));
}

namespace detail {

CallHooks* hooks_of(const torch::nn::Module& module) {
  const auto children = module.named_children();
  const auto* child = children.find(kHooksChild);
  if (child == nullptr) return nullptr;
  const auto* holder = (*child)->as<CallHooksHolder>();
  return holder != nullptr ? holder->hooks() : nullptr;
}

FSDPState* state_of(const torch::nn::Module& module) { return dynamic_cast<FSDPState*>(hooks_of(module)); }

CallHooks* unit_hooks_of(const torch::nn::Module& module) { return state_of(module); }

}  // namespace detail


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

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace fsdp
