#pragma once
// Deferred parameters: a tensor with its full shape but no memory behind it
// (every element aliases one), to be materialised shard by shard by
// fully_shard's param_init. nn's layers create them inside a DeferredInit
// scope; FSDP (core) recognises and fills them. LibTorch 1.13 cannot swap a
// meta tensor's data for CPU memory in place (set_data refuses), so deferred
// tensors are CPU tensors with zero strides instead.

#include <ATen/core/Tensor.h>

namespace fsdp {

at::Tensor deferred_empty(at::IntArrayRef shape, at::ScalarType dtype = at::kFloat);
bool is_deferred(const at::Tensor& t);

}  // namespace fsdp
