#include "fsdp/tensor_parallel/linear_styles.h"

#include "fsdp/common/deferred_tensor.h"
#include "fsdp/common/error.h"
#include "fsdp/tensor_parallel/regions.h"

namespace fsdp::tp {
namespace {

// The layer keeps the group alive as long as it holds its style.
struct Columnwise : nn::LinearForward {
  explicit Columnwise(std::shared_ptr<dist::ProcessGroup> g) : group(std::move(g)) {}
  torch::Tensor forward(nn::LinearImpl& layer, const torch::Tensor& x) override {
    return torch::nn::functional::linear(copy_to_region(x, group), layer.weight, layer.bias);
  }
  std::shared_ptr<dist::ProcessGroup> group;
};

struct Rowwise : nn::LinearForward {
  explicit Rowwise(std::shared_ptr<dist::ProcessGroup> g) : group(std::move(g)) {}
  torch::Tensor forward(nn::LinearImpl& layer, const torch::Tensor& x) override {
    // The bias once, after the sum: each rank's part holds none of it.
    const torch::Tensor y = reduce_from_region(torch::nn::functional::linear(x, layer.weight), group);
    return layer.bias.defined() ? y + layer.bias : y;
  }
  std::shared_ptr<dist::ProcessGroup> group;
};

// This rank's part of `t` along `dim`, in place of the whole (the
// parameter keeps its identity; an optimizer made later sees the part).
void keep_part(torch::Tensor& t, int64_t dim, int rank, int ranks) {
  const int64_t part = t.size(dim) / ranks;
  torch::NoGradGuard no_grad;
  t.set_data(t.detach().narrow(dim, rank * part, part).clone());
}

}  // namespace

void parallelize_linear(nn::LinearImpl& layer, LinearStyle style, const std::shared_ptr<dist::ProcessGroup>& group) {
  FSDP_CHECK(group != nullptr, "parallelize_linear: no tensor-parallel group");
  FSDP_CHECK(!layer.lora_A, "parallelize_linear: a layer with LoRA adapters is not cut (the adapters would need ",
             "cutting alike)");
  FSDP_CHECK(!layer.parallel, "parallelize_linear: the layer is cut already");
  FSDP_CHECK(!is_deferred(layer.weight), "parallelize_linear: the layer's weight is not materialised yet (cut it ",
             "after its values are set)");
  const int ranks = group->size(), rank = group->rank();
  const bool columns = style == LinearStyle::kColumnwise;
  const int64_t dim = columns ? 0 : 1;  // W is (out, in): column-wise cuts out, row-wise cuts in
  FSDP_CHECK(layer.weight.size(dim) % ranks == 0, "parallelize_linear: a ", columns ? "column" : "row",
             "-wise cut of a (", layer.weight.size(0), " out, ", layer.weight.size(1), " in) layer over ", ranks,
             " ranks needs its ", columns ? "output" : "input", " size ", layer.weight.size(dim),
             " to divide by ", ranks);
  keep_part(layer.weight, dim, rank, ranks);
  if (columns && layer.bias.defined()) keep_part(layer.bias, 0, rank, ranks);
  layer.parallel = columns ? std::shared_ptr<nn::LinearForward>(std::make_shared<Columnwise>(group))
                           : std::shared_ptr<nn::LinearForward>(std::make_shared<Rowwise>(group));
}

}  // namespace fsdp::tp
