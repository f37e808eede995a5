#pragma once
// The language-model loss: mean cross-entropy of next-token logits
// hidden @ weight^T against targets. The chunked form (FSDPToys'
// --chunk_loss) never holds the full (N, vocab) logits, in forward or in
// backward: it computes them chunk by chunk and recomputes them for the
// gradients, for the same loss and gradients as the plain form.

#include <torch/torch.h>

namespace fsdp::nn {

// hidden (N, C) or (B, T, C); weight (vocab, C); targets (N) or (B, T).
torch::Tensor lm_loss(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets);
torch::Tensor chunked_lm_loss(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                              int64_t chunk_rows = 1024);

// Per row, the sum of log p(target) over the row's targets other than -100
// (fp32): hidden (B, T, C), targets (B, T) -> (B). A sequence's
// log-likelihood, as preference losses (DPO) compare them. On a CPU the
// head's matmul and the softmax are fused as the loss's are: one (B*T, V)
// tensor is kept for backward, not the logits and their log-softmax.
torch::Tensor sequence_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets);

}  // namespace fsdp::nn
