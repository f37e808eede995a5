#pragma once
// Where a unit's state lives (on its module, as FSDP2 keeps it), and how
// the core finds the units of a module tree. Internal to fsdp.cpp's core.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "fsdp/core/fully_shard.h"

namespace fsdp {

class FSDPState;

// The child module that carries a module's call hooks, of either kind
// (detail::CallHooks): fsdp::call finds them there.
struct CallHooksHolder : torch::nn::Module {
  virtual detail::CallHooks* hooks() const = 0;
};
// Makes `holder` `module`'s first child; a module carries one holder.
void attach_call_hooks(torch::nn::Module& module, std::shared_ptr<CallHooksHolder> holder);
// Hangs a unit's `state` from `module`; `unit_name` names the unit in the
// errors of the conversions and saves its holder refuses.
void attach_unit_state(torch::nn::Module& module, std::shared_ptr<FSDPState> state, const std::string& unit_name);

namespace detail {
// The module's unit, or null (a module without hooks, or a replica).
FSDPState* state_of(const torch::nn::Module& module);
}  // namespace detail

// What identifies a parameter across its names (tied parameters have several).
inline const void* tensor_key(const at::Tensor& t) { return t.unsafeGetTensorImpl(); }

// Modules in `module`'s subtree (itself included) that belong to a unit,
// with their names relative to it. A unit of several modules appears once
// per module.
std::vector<std::pair<std::string, FSDPState*>> unit_modules_under(const torch::nn::Module& module);
// Units in `module`'s subtree, each once, under the name of its first module.
std::vector<std::pair<std::string, FSDPState*>> units_under(const torch::nn::Module& module);

// "prefix.name", or "name" under an empty prefix.
std::string join_name(const std::string& prefix, const std::string& name);

}  // namespace fsdp
