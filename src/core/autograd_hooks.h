#pragma once
// The autograd plumbing fully_shard and replicate share: how each learns
// that a backward ended (or died), that a parameter's gradient was
// accumulated, where a gradient lives in a flat buffer, and how a forward's
// inputs are cast. Owners are reached through weak pointers: a hook that
// outlives its unit or replica does nothing.

#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>

#include "fsdp/common/compat.h"
#include "fsdp/core/options.h"

namespace fsdp {

// Queues `end` on the autograd engine to run when the backward now running
// finishes; if that backward dies first (it threw, and the engine drops its
// callbacks), `abandon` runs instead, when the callback is destroyed.
// Whatever the two capture lives until one of them ran.
void queue_end_of_backward(std::function<void()> end, std::function<void()> abandon);

// Hooks `param`'s AccumulateGrad node: `before` runs before it adds into
// the gradient (may be empty), `after` once it has. Autograd makes a new
// node when the parameter's dtype changes (set_data to a cast copy and
// back), and a node keeps its hooks only while someone holds it: `held` is
// the node hooked last, and a call whose node is still `held` does nothing.
// For a parameter that requires a gradient.
void hook_grad_accumulator(const at::Tensor& param, compat::AutogradNodePtr& held, std::function<void()> before,
                           std::function<void()> after);

// `shape`'s elements of `flat`'s memory from `offset`, as a tensor autograd
// does not treat as a view: optimizers' zero_grad calls detach_() on
// gradients, which views refuse. A gradient that is this alias lives in the
// flat buffer its collective reads or wrote.
at::Tensor flat_alias(const at::Tensor& flat, int64_t offset, at::IntArrayRef shape);

// A forward's floating input in the policy's param dtype, when it casts
// forward inputs; anything else as given.
at::Tensor cast_forward_input(const at::Tensor& input, const MixedPrecisionPolicy& policy);

}  // namespace fsdp
