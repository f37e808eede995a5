#pragma once
// A tensor slot whose bytes are counted (fsdp/common/buffer_accounting.h)
// while it holds a tensor: FSDP's transient buffers live in these, so the
// accounting cannot drift from what is actually held.

#include <utility>

#include <ATen/core/Tensor.h>

#include "fsdp/common/buffer_accounting.h"

namespace fsdp {

class CountedTensor {
 public:
  explicit CountedTensor(memory::BufferKind kind) : kind_(kind) {}
  ~CountedTensor() { reset(); }
  CountedTensor(const CountedTensor&) = delete;
  CountedTensor& operator=(const CountedTensor&) = delete;
  // A move hands the tensor and its count over (the totals do not change),
  // so collectives can return the buffers they hold in a record.
  CountedTensor(CountedTensor&& other) noexcept
      : kind_(other.kind_), tensor_(std::move(other.tensor_)), bytes_(other.bytes_) {
    other.bytes_ = 0;
  }
  CountedTensor& operator=(CountedTensor&& other) noexcept {
    if (this == &other) return *this;
    reset();
    memory::count(other.kind_, -other.bytes_);  // counted under this slot's kind from now on
    tensor_ = std::move(other.tensor_);
    bytes_ = other.bytes_;
    memory::count(kind_, bytes_);
    other.bytes_ = 0;
    return *this;
  }

  // Holds `t` (undefined: holds nothing), releasing what was held before.
  void reset(at::Tensor t = at::Tensor()) {
    memory::count(kind_, -bytes_);
    tensor_ = std::move(t);
    bytes_ = tensor_.defined() ? static_cast<int64_t>(tensor_.nbytes()) : 0;
    memory::count(kind_, bytes_);
  }
  // Gives the tensor up without counting it any longer.
  at::Tensor release() {
    at::Tensor t = tensor_;
    reset();
    return t;
  }
  const at::Tensor& get() const { return tensor_; }
  bool defined() const { return tensor_.defined(); }

 private:
  memory::BufferKind kind_;
  at::Tensor tensor_;
  int64_t bytes_ = 0;
};

}  // namespace fsdp
