#pragma once
// The autograd functions at the edges of a tensor-parallel region
// (Megatron-LM's f and g): each is one collective in one direction and
// nothing in the other.

#include <memory>

#include <torch/torch.h>

#include "fsdp/distributed/process_group.h"

namespace fsdp::tp {

// Forward: x as it is (every rank holds all of it). Backward: the sum of
// the ranks' gradients (each rank's part of the region used x).
torch::Tensor copy_to_region(const torch::Tensor& x, const std::shared_ptr<dist::ProcessGroup>& group);

// Forward: the sum of the ranks' partial results. Backward: the gradient
// as it is (every rank's partial result fed the whole sum).
torch::Tensor reduce_from_region(const torch::Tensor& x, const std::shared_ptr<dist::ProcessGroup>& group);

}  // namespace fsdp::tp
