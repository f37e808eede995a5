#pragma once
// Batches in the order every world size agrees on (the data-order contract):
// rank r of W data-parallel ranks, at optimizer step s and micro-step a of
// A, reads B*T+1 tokens starting at ((s*A + a)*W + r)*B*T, wrapping at the
// end of the file; inputs are the first B*T, targets the last B*T, each
// (B, T). A run at W=2 therefore sees exactly the global batch of W=1.

#include <memory>
#include <string>

#include <torch/torch.h>

#include "fsdp/data/token_file.h"

namespace fsdp::data {

struct Batch {
  torch::Tensor inputs;   // (B, T) int64
  torch::Tensor targets;  // (B, T) int64
};

class DataLoader {
 public:
  // `source` is a token file or "synthetic" (tokens hashed from `seed` and
  // their position in an endless stream, read in the same order as a file).
  // Token ids must be below vocab_size.
  DataLoader(const std::string& source, int64_t batch_size, int64_t seq_len, int rank, int world, int grad_accum,
             int64_t vocab_size, uint64_t seed);

  Batch batch(int64_t step, int micro_step) const;
  // Where batch(step, micro) starts in the token stream (for the contract's tests).
  int64_t offset(int64_t step, int micro_step) const;
  bool synthetic() const { return file_ == nullptr; }
  int64_t tokens_in_file() const { return file_ ? file_->size() : 0; }

 private:
  std::shared_ptr<TokenFile> file_;
  int64_t B_, T_;
  int rank_, world_, grad_accum_;
  int64_t vocab_size_;
  uint64_t seed_;
};

}  // namespace fsdp::data
