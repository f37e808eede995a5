#pragma once
// Every difference between the LibTorch versions fsdp.cpp builds against
// (Debian's 1.13 on CPU, PyTorch 2.x on GPU machines) lives here.

#include <torch/version.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#define FSDP_TORCH_VERSION (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR)

#if FSDP_TORCH_VERSION >= 200
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

namespace fsdp::compat {

// The object whose methods run collectives: in 1.13 a backend *is* a
// ProcessGroup; from 2.0 on, a ProcessGroup dispatches to a c10d::Backend.
#if FSDP_TORCH_VERSION >= 200
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

// Whether Gloo may implement all-gather / reduce-scatter into one flat
// tensor natively. 1.13 throws "no support for _allgather_base in Gloo";
// later versions are probed at run time (see ProcessGroup::native_*).
constexpr bool kGlooMayHaveFlatCollectives = FSDP_TORCH_VERSION >= 200;

}  // namespace fsdp::compat
