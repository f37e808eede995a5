#pragma once
// fully_shard: FSDP for any torch::nn module tree (FSDP2's fully_shard).
//
//   auto mesh = std::make_shared<fsdp::dist::DeviceMesh>(fsdp::make_mesh(world, strategy));
//   fsdp::FullyShardOptions opts{mesh};
//   for (auto& block : model->blocks) fsdp::fully_shard(block, opts);  // units first
//   fsdp::fully_shard(model, opts);                                    // then the root
//   torch::optim::AdamW optim(fsdp::unique_parameters(*model), 1e-3);  // local shards, tied once
//   auto loss = loss_fn(fsdp::call(model, x), y);                       // call, not ->forward
//   loss.backward(); optim.step(); optim.zero_grad();
//
// LibTorch modules have no forward hooks, so a unit's hooks run when it is
// called through fsdp::call (the C++ counterpart of Python's module(x), which
// runs hooks, versus module.forward(x), which does not), or as block(x) when
// its holder is declared with FSDP_MODULE (core/module_holder.h). Model code
// calls its blocks the same way; without FSDP applied it is plain forward.

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "fsdp/core/fsdp_event.h"
#include "fsdp/core/options.h"
#include "fsdp/core/unique_parameters.h"

namespace fsdp {

class FSDPParamGroup;

// Shards the parameters of `module` that no unit below it holds. Apply it to
// submodules (blocks) before their ancestors, and last to the root. Throws
// fsdp::Error, on every rank and before any collective, for a module sharded
// twice or a parameter shared with another unit. A unit may hold several
// dtypes ([Note: a unit of several dtypes]).
void fully_shard(torch::nn::Module& module, const FullyShardOptions& options);

template <typename M>
void fully_shard(torch::nn::ModuleHolder<M>& module, const FullyShardOptions& options) {
  fully_shard(*module, options);
}
template <typename M>
void fully_shard(const std::shared_ptr<M>& module, const FullyShardOptions& options) {
  fully_shard(*module, options);
}

// Several modules as one unit (FSDP2's fully_shard([m1, m2])): one flat
// all-gather and reduce-scatter for all their parameters, tied ones once
// (torchtitan's [norm, output], or an embedding tied to its output head).
// Until an ancestor is sharded, the unit names its parameters "[i].<name
// in module i>" (what param_init receives, too).
// Call each through fsdp::call: the first of them to run in a forward
// gathers, the last to finish reshards and hooks its outputs for backward,
// so the unit stays gathered in between. If one of them does not run in a
// forward, the unit stays gathered until the end of its backward.
void fully_shard(const std::vector<torch::nn::Module*>& modules, const FullyShardOptions& options);

bool is_fully_sharded(const torch::nn::Module& module);

// Run-time settings, FSDP2's methods of the same names. Each applies to
// `module`'s unit and, with `recurse`, to every unit below it. Every rank
// must make the same calls.
//
// Gradient accumulation without communication: while false, backward keeps
// gradients unsharded and unreduced; the next backward with true reduces the sum.
void set_requires_gradient_sync(torch::nn::Module& module, bool sync, bool recurse = true);
// HSDP accumulation with reduce-scatter only: while false, each backward
// reduce-scatters within the shard group and holds the result; the next
// backward with true adds it in and all-reduces across replicas. The
// optimizer must not step in between (gradients are not assigned yet).
void set_requires_all_reduce(torch::nn::Module& module, bool all_reduce, bool recurse = true);
void set_reshard_after_forward(torch::nn::Module& module, ReshardAfterForward reshard, bool recurse = true);
// false: a backward that does not sync gradients leaves the unit gathered,
// so the next micro-step's forward needs no all-gather. A backward that
// syncs always reshards: the optimizer steps sharded parameters.
void set_reshard_after_backward(torch::nn::Module& module, bool reshard, bool recurse = true);
// Gradients summed over the ranks and divided by `factor` instead of
// averaged (for a loss already normalised over the global token count,
// factor 1). factor <= 0 goes back to averaging. With each rank's mean
// loss divided by the world size and factor 1, training equals one process
// on the global batch even where backward rounds to bf16 or fp16 at a world
// size that is not a power of two ([Note: where 1/W enters] in
// src/core/gradient_paths.cpp). Setting a factor or a hook
// (below) on a unit with one rank per shard group moves its gradients out
// of the in-place buffer ([Note: gradients in place]); call it between steps.
void set_gradient_divide_factor(torch::nn::Module& module, double factor, bool recurse = true);
// Called on each unit's reduced gradient shard before the optimizer sees it
// (see ReducedGradHook); an empty function removes it. Once per reduction:
// a unit gathered several times in one backward (activation checkpointing,
// [Note: a unit used again in backward]) calls it on each reduction's shard,
// and the shards add up, as in FSDP2.
void set_all_reduce_hook(torch::nn::Module& module, ReducedGradHook hook, bool recurse = true);
// Called once each reduction of a unit's gradients has assigned them to its
// parameters (see GradientsReady), during backward, while later units'
// backward goes on: where a unit's optimizer step may start early (the
// trainer's --overlap-host-step under CPU offload). Only reductions call
// it: a unit on the in-place path of one rank per shard group without
// replicas has none. Empty removes it.
void set_gradients_ready_hook(torch::nn::Module& module, GradientsReadyHook hook, bool recurse = true);

// Explicit gather and release of a unit's parameters, outside the hooks
// (FSDP2's unshard/reshard): after unshard the unit's forward needs no
// all-gather, and parameters read outside a forward see full tensors. An
// async unshard issues the all-gather and returns; the unit's next forward,
// or wait(), finishes it. reshard() before the optimizer steps.
class UnshardHandle {
 public:
  UnshardHandle() = default;
  UnshardHandle(std::weak_ptr<FSDPParamGroup> group, uint64_t epoch) : group_(std::move(group)), epoch_(epoch) {}
  // Finishes the gather this handle issued, unless the unit used or
  // released it since (a forward ran), or is gone: then it does nothing.
  void wait();

 private:
  std::weak_ptr<FSDPParamGroup> group_;
  uint64_t epoch_ = 0;
};
UnshardHandle unshard(torch::nn::Module& module, bool async_op = false);
void reshard(torch::nn::Module& module);

// Explicit prefetch: when `unit` runs forward (backward), issue the
// all-gathers of `units` right away, instead of the implicit next ones.
void set_modules_to_forward_prefetch(torch::nn::Module& unit, const std::vector<torch::nn::Module*>& units);
void set_modules_to_backward_prefetch(torch::nn::Module& unit, const std::vector<torch::nn::Module*>& units);

// Every parameter's full value, in the order of root.named_parameters(),
// tied parameters once. Collective: all ranks call it, between steps.
std::vector<std::pair<std::string, at::Tensor>> full_parameters(torch::nn::Module& root);

// One parameter as this rank holds it, for checkpoints: `local` is a 1-D
// tensor over elements [begin, begin + numel) of the flattened parameter
// (the whole parameter for one FSDP does not manage). Writing into `local`
// writes the parameter.
struct LocalShard {
  std::string fqn;
  at::Tensor param;             // the registered parameter (optimizer state is keyed by it)
  at::Tensor local;             // 1-D view of what this rank holds
  std::vector<int64_t> shape;   // the full shape
  int64_t begin = 0;
  int64_t numel = 0;
  bool sharded = false;         // false: replicated on every rank (unmanaged or ignored)
  int replica = 0;              // this rank's index across replicas (HSDP, no_shard); 0 otherwise
};
// In the order of root.named_parameters(), tied parameters once. Between
// steps (gathered units are released first).
std::vector<LocalShard> local_shards(torch::nn::Module& root);

// How `root`'s tree is sharded, as a checkpoint records it: the strategy
// and the mesh (replicate, shard) of its units; {"", {}} for a tree without
// units (a replicated or an unsharded module).
struct ShardingRecord {
  std::string strategy;
  std::vector<int64_t> mesh;
};
ShardingRecord sharding_of(const torch::nn::Module& root);

// Every parameter's shape before sharding, in the order of
// root.named_parameters(), tied parameters once.
std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const torch::nn::Module& root);

// Bytes of the sharded master parameters of every unit under `module` (in
// the module's own dtype: fp32 under mixed precision, bf16 for a bf16 module).
int64_t sharded_param_bytes(const torch::nn::Module& module);
// Of those, the bytes of units offloaded to the host (OffloadPolicy::cpu()).
int64_t host_param_bytes(const torch::nn::Module& module);

// One collective or compute boundary FSDP recorded for `root`'s tree (see
// fsdp_event.h): the last 8,192, oldest first.
std::vector<FSDPEvent> event_log(const torch::nn::Module& root);
void clear_event_log(const torch::nn::Module& root);

namespace detail {

// The hooks fsdp::call runs around a module's forward: a unit's
// (fully_shard's FSDPState) or a replica's (replicate's). Each kind plugs
// in here, found on the module it was applied to, so this header knows
// neither.
class CallHooks {
 public:
  virtual ~CallHooks() = default;
  virtual void pre_forward(const torch::nn::Module& module) = 0;
  // A floating input cast to the mixed-precision policy's param dtype.
  virtual at::Tensor cast_input(const at::Tensor& input) const = 0;
  // Puts the post-backward node on these inputs (those requiring
  // gradients), where the kind needs one.
  virtual void wrap_inputs(const std::vector<at::Tensor*>& inputs) = 0;
  // Hooks the outputs (a tensor, a vector or a tuple's tensors) for backward.
  virtual void post_forward(const torch::nn::Module& module, std::vector<at::Tensor>& outputs) = 0;
  // The call threw: the module (for a root, its whole tree) is left ready
  // for the next step.
  virtual void on_forward_error() noexcept = 0;
  // set_requires_gradient_sync, for a kind that takes it on its own module
  // (a replica); false: the kind's units take it from the setter.
  virtual bool set_gradient_sync(bool /*sync*/) { return false; }
};
// The module's hooks, of either kind, or null.
CallHooks* hooks_of(const torch::nn::Module& module);
// The module's hooks when it is a unit of fully_shard, or null.
CallHooks* unit_hooks_of(const torch::nn::Module& module);

// The hooks around one call: pre-forward on construction, post-forward in
// finish(), and, if the call throws before finishing, the module (the
// whole tree, for a root) put back in a state the next step can start
// from. What the call found and did is the hooks' own record, not this
// handle's.
class CallScope {
 public:
  CallScope(CallHooks& hooks, const torch::nn::Module& module) : hooks_(hooks), module_(module) {
    hooks.pre_forward(module);
  }
  ~CallScope() {
    if (!finished_) hooks_.on_forward_error();
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

  template <typename T>
  decltype(auto) cast_arg(T&& arg) const {
    if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
      return cast(arg);
    } else {
      return std::forward<T>(arg);
    }
  }
  // Puts the post-backward node on these inputs (those requiring gradients).
  void wrap_inputs(const std::vector<at::Tensor*>& inputs) { hooks_.wrap_inputs(inputs); }

  // Runs post_forward on the tensors of an output: a tensor, a vector or a
  // tuple of tensors. Other output types cannot carry backward hooks.
  template <typename R>
  R finish(R out);

 private:
  at::Tensor cast(const at::Tensor& input) const { return hooks_.cast_input(input); }
  void finish_tensors(std::vector<at::Tensor>& outputs) {
    finished_ = true;
    hooks_.post_forward(module_, outputs);
  }

  CallHooks& hooks_;
  const torch::nn::Module& module_;
  bool finished_ = false;
};

template <typename T>
struct is_tensor_tuple : std::false_type {};
template <typename... Ts>
struct is_tensor_tuple<std::tuple<Ts...>> : std::conjunction<std::is_same<Ts, at::Tensor>...> {};

template <typename R>
R CallScope::finish(R out) {
  if constexpr (std::is_same_v<R, at::Tensor>) {
    std::vector<at::Tensor> outs{std::move(out)};
    finish_tensors(outs);
    return outs[0];
  } else if constexpr (std::is_same_v<R, std::vector<at::Tensor>>) {
    finish_tensors(out);
    return out;
  } else if constexpr (is_tensor_tuple<R>::value) {
    std::vector<at::Tensor> outs;
    std::apply([&](auto&... t) { (outs.push_back(t), ...); }, out);
    finish_tensors(outs);
    size_t i = 0;
    std::apply([&](auto&... t) { ((t = outs[i++]), ...); }, out);
    return out;
  } else {
    static_assert(sizeof(R) == 0, "fsdp::call: a unit's forward must return a Tensor, a vector or a tuple of Tensors");
  }
}

// `module`'s forward threw a LibTorch error that points at the 1-D shards
// of units below it (the sign of one called as block->forward(x), or
// through a TORCH_MODULE holder, both of which skip its hooks): throws
// fsdp::Error naming them and what to call instead. Returns otherwise, for
// a rethrow of LibTorch's own error.
void explain_forward_error(const torch::nn::Module& module, const c10::Error& error);

template <typename Fn>
auto forward_explained(const torch::nn::Module& module, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    explain_forward_error(module, e);
    throw;
  }
}

inline void collect_tensor(at::Tensor& t, std::vector<at::Tensor*>& out) { out.push_back(&t); }
template <typename T>
void collect_tensor(T& /*not a tensor*/, std::vector<at::Tensor*>& /*out*/) {}

inline torch::nn::Module& module_of(torch::nn::Module& m) { return m; }
template <typename M>
M& module_of(torch::nn::ModuleHolder<M>& m) { return *m; }
template <typename M>
M& module_of(const std::shared_ptr<M>& m) { return *m; }

}  // namespace detail

// Calls module's forward with FSDP's hooks when it is a unit: gather before;
// after, reshard, and hook the outputs (pre-backward) and the tensor inputs
// (post-backward, see [Note: when a unit's backward ends]). For a module
// replicated by fsdp::replicate, hooks the outputs for its backward.
template <typename M, typename... Args>
auto call(M& module, Args&&... args) {
  auto& impl = detail::module_of(module);
  detail::CallHooks* hooks = detail::hooks_of(impl);
  if (hooks == nullptr) return impl.forward(std::forward<Args>(args)...);
  detail::CallScope scope(*hooks, impl);
  std::tuple<decltype(scope.cast_arg(std::forward<Args>(args)))...> inputs(scope.cast_arg(std::forward<Args>(args))...);
  std::vector<at::Tensor*> tensors;
  std::apply([&](auto&... a) { (detail::collect_tensor(a, tensors), ...); }, inputs);
  scope.wrap_inputs(tensors);
  auto out = detail::forward_explained(impl, [&] {
    return std::apply([&](auto&&... a) { return impl.forward(std::forward<decltype(a)>(a)...); }, std::move(inputs));
  });
  return scope.finish(std::move(out));
}

// Runs fn() as if it were module's forward (gathered before, hooks after):
// for work that uses a unit's parameters around its forward, like a language
// model's output head applied to the hidden states its forward returns. Use
// it where such work runs without gradients: after a no-grad forward every
// unit is resharded, the root too.
template <typename M, typename Fn>
auto run(M& module, Fn&& fn) {
  auto& impl = detail::module_of(module);
  detail::CallHooks* hooks = detail::unit_hooks_of(impl);
  if (hooks == nullptr) return fn();
  detail::CallScope scope(*hooks, impl);
  auto out = fn();
  return scope.finish(std::move(out));
}

}  // namespace fsdp
