#include "fsdp/models/kv_cache.h"

#include <cmath>
#include <limits>

#include "fsdp/common/error.h"
#include "fsdp/models/attention.h"

namespace fsdp::models {

KvCache::Layer& KvCache::layer(size_t index) {
  if (layers.size() <= index) layers.resize(index + 1);
  return layers[index];
}

std::pair<torch::Tensor, torch::Tensor> KvCache::append(size_t index, const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t T = k.size(1);
  FSDP_CHECK(length + T <= capacity, "key/value cache: ", length + T, " tokens, more than its ", capacity);
  Layer& l = layer(index);
  if (!l.keys.defined()) {
    l.keys = torch::empty({k.size(0), capacity, k.size(2), k.size(3)}, k.options());
    l.values = torch::empty({v.size(0), capacity, v.size(2), v.size(3)}, v.options());
  }
  l.keys.narrow(1, length, T).copy_(k);
  l.values.narrow(1, length, T).copy_(v);
  return {l.keys.narrow(1, 0, length + T), l.values.narrow(1, 0, length + T)};
}

torch::Tensor cached_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t B = q.size(0), Tn = q.size(1), nh = q.size(2), hs = q.size(3), Tt = k.size(1);
  if (Tn == Tt) return causal_attention(q, k, v);  // nothing cached before: the training path
  auto qh = q.transpose(1, 2);                      // (B, nh, Tn, hs)
  auto kh = k.transpose(1, 2), vh = v.transpose(1, 2);
  const int64_t rep = nh / k.size(2);
  if (rep > 1) {
    kh = kh.repeat_interleave(rep, 1);
    vh = vh.repeat_interleave(rep, 1);
  }
  auto scores = qh.matmul(kh.transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(hs)));  // (B, nh, Tn, Tt)
  if (Tn > 1) {
    // Query i (position Tt - Tn + i) sees keys up to its own position.
    const auto opts = torch::TensorOptions().dtype(torch::kLong).device(q.device());
    const auto query_pos = torch::arange(Tt - Tn, Tt, opts).unsqueeze(1);
    const auto key_pos = torch::arange(Tt, opts).unsqueeze(0);
    scores.masked_fill_(key_pos > query_pos, -std::numeric_limits<float>::infinity());
  }
  return scores.softmax(-1).matmul(vh).transpose(1, 2).reshape({B, Tn, nh * hs});
}

}  // namespace fsdp::models
