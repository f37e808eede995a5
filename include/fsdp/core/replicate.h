#pragma once
// replicate: DDP for LibTorch modules (FSDP2's replicate, PyTorch's
// DistributedDataParallel). Every rank keeps the whole module; gradients
// are averaged over the ranks in buckets, each all-reduced as soon as its
// last gradient exists, so communication overlaps the rest of backward.
//
//   auto world = fsdp::dist::World::init(...);
//   fsdp::ReplicateOptions options{world};
//   fsdp::replicate(model, options);             // rank 0's weights on every rank
//   auto loss = loss_fn(fsdp::call(model, x), y); // or model(x) with FSDP_MODULE
//   loss.backward();                              // gradients averaged over the ranks
//   optimizer.step();
//
// The module is called through its hooks (fsdp::call, or an FSDP_MODULE
// holder): the call marks where its backward starts, so the end of that
// backward (when the last buckets are reduced and the gradients written
// back) is known even when activation checkpointing runs backwards inside
// it. set_requires_gradient_sync(model, false) skips the reduction (DDP's
// no_sync): gradients accumulate locally, and the next synchronised
// backward averages their sum. See [Note: replicate's buckets] in
// src/core/replicate.cpp.

#include <cstdint>
#include <memory>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "fsdp/core/options.h"
#include "fsdp/distributed/process_group.h"

namespace fsdp {

struct ReplicateOptions {
  std::shared_ptr<dist::World> world;  // required: the module is replicated over all its ranks
  // Gradient bytes per bucket (DDP's bucket_cap_mb); parameters fill
  // buckets in reverse registration order, the order backward meets them.
  double bucket_cap_mb = 25.0;
  // Broadcast rank 0's parameters and buffers at replicate() (as DDP does
  // at construction); false trusts every rank's own initialisation.
  bool sync_module_states = true;
  // Broadcast rank 0's buffers (running statistics) before every forward,
  // as DDP's broadcast_buffers does ([Note: buffers under replicate]);
  // false leaves each rank's to follow its own batches.
  bool broadcast_buffers = true;
  // DDP's mixed_precision: with a param_dtype, every floating parameter
  // (but those of modules keep_full_precision names, BatchNorm by default,
  // which stay in their dtype and are averaged in it) is cast to it before
  // each forward (the fp32 values stay the master the
  // optimizer steps) and floating inputs too (cast_forward_inputs);
  // gradients are computed in it, averaged in reduce_dtype (param_dtype
  // when unset) and handed over in each parameter's own dtype. Gradients
  // kept across micro-steps (no sync) accumulate in the parameter's dtype.
  // output_dtype is fully_shard's alone: cast the output yourself.
  MixedPrecisionPolicy mixed_precision;
};

// Refuses (fsdp::Error) a module replicated already, or one with a unit
// sharded by fully_shard under it.
void replicate(torch::nn::Module& module, const ReplicateOptions& options);
template <typename M>
void replicate(torch::nn::ModuleHolder<M>& module, const ReplicateOptions& options) {
  replicate(*module, options);
}

bool is_replicated(const torch::nn::Module& module);

// What the last synchronised backward of a replicated module did.
struct ReplicateStats {
  int64_t buckets = 0;
  // Buckets whose all-reduce started before backward ended (overlapped).
  int64_t reduced_during_backward = 0;
  // Buckets averaged again at the end, because a parameter got another
  // gradient after their all-reduce started (checkpointed regions that
  // recompute it run backwards of their own inside this one).
  int64_t reduced_again = 0;
  int64_t synchronised_backwards = 0;  // since replicate()
};
ReplicateStats replicate_stats(const torch::nn::Module& module);

}  // namespace fsdp
