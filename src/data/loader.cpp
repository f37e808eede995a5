#include "fsdp/data/loader.h"

#include "fsdp/common/error.h"

namespace fsdp::data {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

DataLoader::DataLoader(const std::string& source, int64_t batch_size, int64_t seq_len, int rank, int world,
                       int grad_accum, int64_t vocab_size, uint64_t seed)
    : B_(batch_size), T_(seq_len), rank_(rank), world_(world), grad_accum_(grad_accum), vocab_size_(vocab_size),
      seed_(seed) {
  FSDP_CHECK(B_ >= 1 && T_ >= 1 && grad_accum_ >= 1, "data: batch_size, seq_len and grad_accum must be at least 1");
  if (source == "synthetic") return;
  file_ = std::make_shared<TokenFile>(source);
  const auto [max_id, where] = file_->max_token();
  FSDP_CHECK(max_id < vocab_size_, "'", source, "' holds token id ", max_id, " (at position ", where,
             "), which is not below the model's vocabulary of ", vocab_size_,
             " (a file tokenized for another model?)");
  FSDP_CHECK(file_->size() > B_ * T_, "'", source, "' holds ", file_->size(), " tokens, fewer than one batch of ",
             B_, " x ", T_, " + 1");
}

int64_t DataLoader::offset(int64_t step, int micro_step) const {
  return ((step * grad_accum_ + micro_step) * world_ + rank_) * B_ * T_;
}

Batch DataLoader::batch(int64_t step, int micro_step) const {
  auto tokens = torch::empty({B_ * T_ + 1}, torch::kLong);
  if (file_) {
    file_->read(offset(step, micro_step) % file_->size(), B_ * T_ + 1, tokens.data_ptr<int64_t>());
  } else {
    // An endless virtual file: the token at position p is a hash of (seed, p),
    // so synthetic runs keep the data-order contract at any world size too.
    auto* out = tokens.data_ptr<int64_t>();
    const int64_t start = offset(step, micro_step);
    for (int64_t i = 0; i <= B_ * T_; ++i) {
      out[i] = static_cast<int64_t>(splitmix64(seed_ ^ static_cast<uint64_t>(start + i)) % static_cast<uint64_t>(vocab_size_));
    }
  }
  return {tokens.narrow(0, 0, B_ * T_).view({B_, T_}), tokens.narrow(0, 1, B_ * T_).view({B_, T_})};
}

}  // namespace fsdp::data
