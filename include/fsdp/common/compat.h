#pragma once
// Every difference between the LibTorch versions and devices fsdp.cpp builds
// against (Debian's 1.13 on CPU, PyTorch 2.x on GPU machines) lives here.

#include <torch/version.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <torch/csrc/autograd/function.h>
#include <torch/optim/optimizer.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "fsdp/common/error.h"

#define FSDP_TORCH_VERSION (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR)

#if FSDP_TORCH_VERSION >= 200
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif
#ifdef FSDP_WITH_CUDA
#include <ATen/native/cuda/Resize.h>
#endif

namespace fsdp::compat {

// The object whose methods run collectives: in 1.13 a backend *is* a
// ProcessGroup; from 2.0 on, a ProcessGroup dispatches to a c10d::Backend.
#if FSDP_TORCH_VERSION >= 200
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

// Autograd's graph nodes (grad_fn, gradient accumulators): owned through
// std::shared_ptr up to 1.13, through c10::intrusive_ptr in 2.13. Taken
// from what LibTorch's own accessor returns, so no version test is needed.
using AutogradNodePtr =
    std::decay_t<decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()))>;

template <typename Owning>
struct WeakHandle;
template <typename T>
struct WeakHandle<std::shared_ptr<T>> {
  using type = std::weak_ptr<T>;
};
template <typename T>
struct WeakHandle<c10::intrusive_ptr<T>> {
  using type = c10::weak_intrusive_ptr<T>;
};
// A handle that does not keep the node (and its graph) alive; expired()
// tells whether the graph was dropped.
using AutogradNodeWeakPtr = WeakHandle<AutogradNodePtr>::type;

// c10::Allocator::allocate is const up to 2.2; PyTorch 2.3 dropped the
// const and made copy_data (used by Storage copies) pure virtual.
#if FSDP_TORCH_VERSION >= 203
#define FSDP_ALLOCATE_CONST
#define FSDP_ALLOCATOR_NEEDS_COPY_DATA 1
#else
#define FSDP_ALLOCATE_CONST const
#define FSDP_ALLOCATOR_NEEDS_COPY_DATA 0
#endif

// Whether Gloo may implement all-gather into one flat tensor natively. 1.13
// throws "no support for _allgather_base in Gloo"; later versions are
// probed at run time (see ProcessGroup::native_*).
constexpr bool kGlooMayHaveFlatAllGather = FSDP_TORCH_VERSION >= 200;
// Gloo's reduce-scatter (2.x) is not used: it sums in its ring's order, so
// at a world size that is not a power of two the sum rounds differently
// from rank order, and AdamW's first steps magnify that on gradients that
// nearly cancel (measured: Qwen3-MoE at W = 3, 3.9e-4 from one process
// after 5 steps). Ours sums in rank order on every version; see
// [Note: reduce-scatter on Gloo]. It is also the faster: 9.1 ms against
// Gloo's 20.1 ms for 16 MiB at W = 2 on LibTorch 2.13 (AMD EPYC, 2 cores,
// one thread a rank; all_to_all_single plus a sum against
// reduce_scatter_tensor, timed from Python).
constexpr bool kGlooMayHaveFlatReduceScatter = false;

#ifdef FSDP_WITH_CUDA
constexpr const char* kCudaSuffix = " and CUDA";
#else
constexpr const char* kCudaSuffix = " only";
#endif

// Frees (nbytes = 0) or re-grows a tensor's storage in place, on whatever
// device it lives: views of it made earlier (saved by autograd) stay valid
// and see the new memory. The one place FSDP's gathered buffers change size.
inline void resize_storage_bytes(const at::Tensor& t, int64_t nbytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (t.is_cpu()) {
    at::native::resize_bytes_cpu(storage, static_cast<size_t>(nbytes));
    return;
  }
#ifdef FSDP_WITH_CUDA
  if (t.is_cuda()) {
    at::native::resize_bytes_cuda(storage, static_cast<size_t>(nbytes));
    return;
  }
#endif
  throw Error(
      detail::concat("fsdp: cannot resize storage on device ", t.device(), ": this build supports CPU", kCudaSuffix));
}

// The key of a parameter's entry in Optimizer::state(): 1.13 keys by the
// TensorImpl's address printed as a string, later versions by the address.
using OptimizerStateKey = std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

template <typename Key = OptimizerStateKey>  // a template so that only one branch is compiled
Key optimizer_state_key(const at::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream address;
    address << static_cast<const void*>(param.unsafeGetTensorImpl());
    return address.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

// Gradients set to none rather than zeroed (PyTorch's default since 2.0,
// which 1.13's C++ optimizer lacks): between steps a sharded gradient holds
// no memory, and the next backward's reduce-scatter output becomes the
// gradient instead of being added to zeros.
inline void zero_grad_to_none(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) p.mutable_grad() = at::Tensor();
  }
}

}  // namespace fsdp::compat
