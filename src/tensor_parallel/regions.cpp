#include "fsdp/tensor_parallel/regions.h"

#include <torch/csrc/autograd/custom_function.h>

#include "fsdp/distributed/collectives.h"

namespace fsdp::tp {
namespace {

torch::Tensor summed_over(dist::ProcessGroup& group, const torch::Tensor& x) {
  auto out = x.contiguous().clone();
  dist::all_reduce(group, out, dist::ReduceOp::kSum).wait();
  return out;
}

// The group rides in the context as a raw pointer: the layer that applies
// the function holds the group's shared_ptr for as long as its graph lives.
struct CopyToRegion : public torch::autograd::Function<CopyToRegion> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<dist::ProcessGroup*>(ctx->saved_data["group"].toInt());
    return {summed_over(*group, grads[0]), torch::Tensor()};
  }
};

struct ReduceFromRegion : public torch::autograd::Function<ReduceFromRegion> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x, int64_t group) {
    return summed_over(*reinterpret_cast<dist::ProcessGroup*>(group), x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

int64_t handle(const std::shared_ptr<dist::ProcessGroup>& group) { return reinterpret_cast<int64_t>(group.get()); }

}  // namespace

torch::Tensor copy_to_region(const torch::Tensor& x, const std::shared_ptr<dist::ProcessGroup>& group) {
  return CopyToRegion::apply(x, handle(group));
}

torch::Tensor reduce_from_region(const torch::Tensor& x, const std::shared_ptr<dist::ProcessGroup>& group) {
  return ReduceFromRegion::apply(x, handle(group));
}

}  // namespace fsdp::tp
