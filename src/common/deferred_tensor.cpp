#include "fsdp/common/deferred_tensor.h"

#include <ATen/ATen.h>

namespace fsdp {

at::Tensor deferred_empty(at::IntArrayRef shape, at::ScalarType dtype) {
  return at::empty_strided(shape, std::vector<int64_t>(shape.size(), 0), at::TensorOptions().dtype(dtype));
}

bool is_deferred(const at::Tensor& t) {
  return t.numel() > 1 &&
         static_cast<int64_t>(t.storage().nbytes()) < t.numel() * static_cast<int64_t>(t.element_size());
}

}  // namespace fsdp
