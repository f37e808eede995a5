#pragma once
// Rows that hold several whole examples each (the trainer's data.pack):
// for every token, its position inside its example and the column of its
// row where its example starts. While a PackedRowsScope is alive on a
// thread, that thread's forwards (and the backwards that recompute them)
// read it (activation checkpointing saves it with a block and puts it back
// around the block's recomputation, which on a GPU runs on autograd's
// device thread): causal_attention lets a query see only the keys of its own
// example (a block-diagonal causal mask; on the CPU kernel, each query's
// row of weights starts at its example's first key), and the families'
// positions (rotary tables, GPT-2's learned ones) restart at each example,
// so a packed row computes what its examples would one per row.

#include <torch/torch.h>

namespace fsdp::nn {

struct PackedRows {
  torch::Tensor positions;  // (B, T) int64, on the batch's device
  torch::Tensor starts;     // (B, T) int64, on the CPU: the column where each token's example starts
};

class PackedRowsScope {
 public:
  explicit PackedRowsScope(const PackedRows& rows);
  ~PackedRowsScope();
  PackedRowsScope(const PackedRowsScope&) = delete;
  PackedRowsScope& operator=(const PackedRowsScope&) = delete;
  // The innermost live scope's rows on this thread, or null.
  static const PackedRows* current();

 private:
  const PackedRows* previous_;
};

// The rows in force for a (B, T) batch: the current scope's, checked to
// be of that shape (throws naming both), or null when none is.
const PackedRows* packed_rows_for(int64_t B, int64_t T);

}  // namespace fsdp::nn
