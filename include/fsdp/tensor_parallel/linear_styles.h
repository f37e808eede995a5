#pragma once
// Tensor parallelism's two linear styles (Megatron-LM's column- and
// row-parallel layers; PyTorch's ColwiseParallel and RowwiseParallel), on
// the project's nn::Linear. A layer is cut across the ranks of a TP group:
//
//   column-wise: rank r holds rows [r*out/N, (r+1)*out/N) of W (and of b):
//     forward  y_r = x W_r^T + b_r       (x whole on every rank)
//     backward dx  = sum over ranks of dy_r W_r   (an all-reduce)
//   row-wise:    rank r holds columns [r*in/N, (r+1)*in/N) of W (b whole):
//     forward  y = sum over ranks of x_r W_r^T, + b   (an all-reduce)
//     backward dx_r = dy W_r            (dy whole on every rank)
//
// so a column-wise layer followed by a row-wise one (an MLP's up and down
// projections, attention's q/k/v and o) costs one all-reduce forward and
// one backward, and the activation between them stays cut. The
// collectives are autograd functions (regions.h), so any loss, clipping
// or optimizer sees ordinary tensors.

#include <memory>

#include <torch/torch.h>

#include "fsdp/distributed/process_group.h"
#include "fsdp/nn/layers.h"

namespace fsdp::tp {

enum class LinearStyle { kColumnwise, kRowwise };

// Cuts `layer` (its full weight and bias, as built) for this rank of
// `group`, and makes its forward the style's. Throws naming the layer's
// shape when the cut dimension does not divide by the group's size.
void parallelize_linear(nn::LinearImpl& layer, LinearStyle style, const std::shared_ptr<dist::ProcessGroup>& group);

}  // namespace fsdp::tp
