// fully_shard's run-time API (FSDP2's FSDPModule methods): the setters,
// explicit unshard and reshard, prefetch lists, the event log, and the
// explanation of a unit called around its hooks. Sharding itself is
// fully_shard_init.cpp's, the state dicts state_dict.cpp's.
#include "fsdp/core/fully_shard.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <unordered_set>

#include "fsdp/common/error.h"

#include "core/fsdp_state.h"
#include "core/units.h"

namespace fsdp {
namespace detail {

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

bool is_fully_sharded(const torch::nn::Module& module) { return detail::state_of(module) != nullptr; }

std::vector<FSDPEvent> event_log(const torch::nn::Module& root) {
  FSDPState* state = detail::state_of(root);
  FSDP_CHECK(state != nullptr, "event_log: module ", root.name(), " is not sharded");
  return state->tree()->log().events();
}

void clear_event_log(const torch::nn::Module& root) {
  FSDPState* state = detail::state_of(root);
  FSDP_CHECK(state != nullptr, "clear_event_log: module ", root.name(), " is not sharded");
  state->tree()->log().clear();
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
  if (detail::CallHooks* hooks = detail::hooks_of(module); hooks != nullptr && hooks->set_gradient_sync(sync)) return;
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

void set_gradients_ready_hook(torch::nn::Module& module, GradientsReadyHook hook, bool recurse) {
  for_each_group(module, recurse, "set_gradients_ready_hook",
                 [&](FSDPParamGroup& g) { g.set_gradients_ready_hook(hook); });
}

void set_reshard_after_forward(torch::nn::Module& module, ReshardAfterForward reshard, bool recurse) {
  for (FSDPState* s : units_for(module, recurse, "set_reshard_after_forward")) s->set_reshard_after_forward(reshard);
}

void UnshardHandle::wait() {
  const std::shared_ptr<FSDPParamGroup> group = group_.lock();
  if (group != nullptr && group->epoch() == epoch_) group->wait_for_unshard();
  group_.reset();
}

UnshardHandle unshard(torch::nn::Module& module, bool async_op) {
  FSDPState* s = detail::state_of(module);
  FSDP_CHECK(s != nullptr, "unshard: module ", module.name(), " is not sharded; apply fully_shard first");
  if (s->group() == nullptr) return UnshardHandle();
  s->group()->unshard();
  UnshardHandle handle(s->group()->weak_from_this(), s->group()->epoch());
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


}  // namespace fsdp
