#pragma once
// Sharded modules called as modules: FSDP_MODULE(Name) beside LibTorch's
// TORCH_MODULE(Name). Its holder's call operator runs the unit's FSDP hooks
// (fsdp::call), as Python's module(x) runs a module's hooks; TORCH_MODULE's
// calls forward directly, which reads the sharded parameters of a unit
// between its calls (1-D shards, not the module's shapes).
//
//   struct BlockImpl : torch::nn::Module { torch::Tensor forward(torch::Tensor x); ... };
//   FSDP_MODULE(Block);                    // instead of TORCH_MODULE(Block)
//   Block block(...);
//   fsdp::fully_shard(block, options);
//   auto y = block(x);                     // gathers, runs forward, hooks backward
//
// Without FSDP applied, block(x) is block->forward(x). block->forward(x)
// still skips the hooks, as module.forward(x) does in Python.

#include <utility>

#include <torch/nn/pimpl.h>

#include "fsdp/core/fully_shard.h"

namespace fsdp {

template <typename Contained>
class ModuleHolder : public torch::nn::ModuleHolder<Contained> {
 public:
  using torch::nn::ModuleHolder<Contained>::ModuleHolder;

  template <typename... Args>
  auto operator()(Args&&... args) {
    return fsdp::call(static_cast<torch::nn::ModuleHolder<Contained>&>(*this), std::forward<Args>(args)...);
  }
};

}  // namespace fsdp

// Declares `Name`, a holder of `NameImpl` whose calls run FSDP's hooks.
#define FSDP_MODULE(Name)                                      \
  class Name : public ::fsdp::ModuleHolder<Name##Impl> {       \
   public:                                                     \
    using ::fsdp::ModuleHolder<Name##Impl>::ModuleHolder;      \
    using Impl = Name##Impl;                                   \
  }
