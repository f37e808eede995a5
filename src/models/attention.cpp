#include "fsdp/models/attention.h"

#include <cmath>
#include <limits>

namespace fsdp::models {

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               torch::nn::Dropout* dropout) {
  const int64_t T = q.size(-2);
  auto scores = q.matmul(k.transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  auto future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool)).triu(1);
  auto weights = scores.masked_fill_(future, -std::numeric_limits<float>::infinity()).softmax(-1);
  return (dropout != nullptr ? (*dropout)(weights) : weights).matmul(v);
}

}  // namespace fsdp::models
