#pragma once
// The layout of fp32 logits on the fused loss's path (nn::lm_loss): stored
// transposed, (vocab, rows), each of the vocab's rows `stride` floats
// apart. Light (no LibTorch): fsdp plan counts the same buffer.

#include <cstdint>

namespace fsdp::nn {

// Rows padded off a multiple of 4 KiB (1024 floats): the loss kernel reads
// a short piece of every row, and at a 4 KiB stride all of them would fall
// in the same cache sets. 64 floats, 16 more when that lands on a multiple.
inline int64_t transposed_logits_stride(int64_t rows) {
  const int64_t stride = rows + 64;
  return stride % 1024 == 0 ? stride + 16 : stride;
}

}  // namespace fsdp::nn
