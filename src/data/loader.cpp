#include "fsdp/data/loader.h"

#include <algorithm>

#include "fsdp/common/error.h"
#include "fsdp/data/loss_mask.h"
#include "fsdp/data/mixture.h"
#include "fsdp/data/tokenizer_record.h"

namespace fsdp::data {
namespace {

// [Note: padding to the batch]
// One example a row, a micro-batch is as wide as its longest row rounded
// up to a multiple of kPadMultiple (at most T), as TRL's collator pads to
// the batch's longest (pad_to_multiple_of): rows of 40 tokens under
// --seq-len 2048 cost 40 columns, not 2048. The rounding keeps the shapes
// the matmuls and attention see to a few per run (their blocking likes
// multiples of 8). Padding is after every real token and never a target,
// and attention is causal, so the width changes no loss. What the stream
// positions count (T per row) and the data-order contract stay as they
// were: the width is only the tensor's. The memory plan still plans for T,
// the widest a micro-batch can be.
constexpr int64_t kPadMultiple = 8;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

int64_t permute_index(int64_t i, int64_t n, uint64_t seed, uint64_t epoch) {
  // Balanced Feistel over 2*half bits, 4 rounds; values >= n walk again,
  // which ends because the network is a bijection of [0, 4^half).
  int half = 1;
  while ((int64_t{1} << (2 * half)) < n) ++half;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  const uint64_t key = splitmix64(seed ^ splitmix64(epoch + 0x51ed270b2a8e1c4bull));
  uint64_t x = static_cast<uint64_t>(i);
  do {
    uint64_t left = x >> half, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = splitmix64(key ^ (right * 0x9e3779b97f4a7c15ull) ^ round) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

DataLoader::DataLoader(const std::string& source, const LoaderOptions& options) : o_(options) {
  FSDP_CHECK(o_.batch_size >= 1 && o_.seq_len >= 1 && o_.grad_accum >= 1,
             "data: batch_size, seq_len and grad_accum must be at least 1");
  if (source == "synthetic") return;
  if (const auto mixture = parse_mixture(source, o_.flag); !mixture.empty()) {
    // [Note: a mixture's schedule]: each source a loader of its own.
    FSDP_CHECK(!o_.pack, "data.pack packs the examples of one source; ", o_.flag, " '", source, "' mixes ",
               mixture.size(), " sources: train them one a row, without --pack");
    std::vector<double> weights;
    for (size_t k = 0; k < mixture.size(); ++k) {
      LoaderOptions part = o_;
      part.seed = o_.seed + k;  // each source its own shuffle
      part.flag = o_.flag + " source '" + mixture[k].source + "'";
      parts_.push_back(std::make_unique<DataLoader>(mixture[k].source, part));
      weights.push_back(mixture[k].weight);
      FSDP_CHECK((parts_[k]->examples() > 0) == (parts_[0]->examples() > 0), o_.flag, " '", source, "' mixes chat ",
                 "data (with loss masks) and plain token files ('", mixture[0].source, "', '", mixture[k].source,
                 "'); mix sources of one kind");
      FSDP_CHECK(!parts_[k]->preference_pairs(), o_.flag, " '", source, "': '", mixture[k].source, "' holds ",
                 "preference pairs, which a mixture does not interleave; train them alone");
    }
    schedule_ = std::make_unique<MixtureSchedule>(weights);
    return;
  }
  const auto paths = expand_token_paths(source, o_.flag);
  stream_ = std::make_shared<TokenStream>(paths);
  // Chat data: every file's record says so, and its mask lies beside it.
  for (size_t k = 0; k < paths.size(); ++k) {
    const auto record = tokenizer_record_beside(paths[k]);
    const bool examples = record && record->examples;
    if (k == 0) pairs_ = record && record->preference_pairs;
    FSDP_CHECK((record && record->preference_pairs) == pairs_, o_.flag, " '", source, "' mixes preference pairs and ",
               "other data; train on one kind at a time");
    if (k > 0 && examples != !example_starts_.empty()) {
      throw Error(o_.flag + " '" + source + "' mixes chat data (with loss masks) and plain token files; train on one "
                  "kind at a time");
    }
    if (!examples) continue;
    const TokenFile file(paths[k]);
    const auto mask = read_loss_mask_file(loss_mask_path(paths[k]), file.size());
    for (size_t t = 0; t < mask.size(); ++t) {
      if (mask[t] & kMaskExampleStart) example_starts_.push_back(static_cast<int64_t>(mask_.size() + t));
    }
    // Shards (--shard-tokens) cut examples anywhere: only the stream's
    // first token must start one.
    FSDP_CHECK(k > 0 || (!mask.empty() && (mask[0] & kMaskExampleStart)), "'", loss_mask_path(paths[k]),
               "' does not start an example at its first token; prepare the data again");
    mask_.insert(mask_.end(), mask.begin(), mask.end());
  }
  const auto max = stream_->max_token();
  FSDP_CHECK(max.id < o_.vocab_size, "'", max.path, "' holds token id ", max.id, " (at position ", max.position,
             "), which is not below the model's vocabulary of ", o_.vocab_size,
             " (a file tokenized for another model?)", o_.vocab_advice ? "; " + o_.vocab_advice(max.id) : "");
  const int64_t B = o_.batch_size, T = o_.seq_len;
  FSDP_CHECK(!example_starts_.empty() || stream_->size() > B * T, o_.flag, " '", source, "' holds ", stream_->size(),
             " tokens, fewer than one batch of ", B, " x ", T, " + 1");
  FSDP_CHECK(!o_.pack || !example_starts_.empty(), "data.pack packs chat examples (token files with loss masks, "
             "from `fsdp data prepare` of chat data), and ", o_.flag, " '", source, "' is a plain token stream");
  FSDP_CHECK(!pairs_ || examples() % 2 == 0, o_.flag, " '", source, "' is preference data but holds ", examples(),
             " examples, not pairs of them; prepare the data again");
  FSDP_CHECK(!o_.pack || !pairs_, "data.pack packs examples into rows, and ", o_.flag, " '", source, "' holds preference ",
             "pairs, each two rows of a batch (chosen, rejected); train them without --pack");
  if (!o_.pack) return;
  // Consecutive examples while their inputs (L - 1 each, L cut to T + 1) fit T.
  row_first_.push_back(0);
  int64_t used = 0;
  for (int64_t e = 0; e < static_cast<int64_t>(example_starts_.size()); ++e) {
    const int64_t inputs = std::min(example_length(e), T + 1) - 1;
    if (used + inputs > T) {
      row_first_.push_back(e);
      used = 0;
    }
    used += inputs;
  }
  row_first_.push_back(examples());
}

int64_t DataLoader::row_of(int64_t i) const {
  const int64_t n = rows();
  return o_.shuffle ? permute_index(i % n, n, o_.seed, static_cast<uint64_t>(i / n)) : i % n;
}

int64_t DataLoader::read_packed(int64_t i, int64_t* inputs, int64_t* targets, int64_t* positions,
                                int64_t* starts) const {
  const int64_t T = o_.seq_len;
  const int64_t r = row_of(i);
  std::vector<int64_t> tokens(static_cast<size_t>(T + 1));
  int64_t column = 0, trained = 0;
  for (int64_t e = row_first_[static_cast<size_t>(r)]; e < row_first_[static_cast<size_t>(r) + 1]; ++e) {
    const int64_t begin = example_starts_[static_cast<size_t>(e)];
    const int64_t length = std::min(example_length(e), T + 1);
    stream_->read(begin, length, tokens.data());
    for (int64_t k = 0; k + 1 < length; ++k, ++column) {
      inputs[column] = tokens[static_cast<size_t>(k)];
      const bool keep = (mask_[static_cast<size_t>(begin + k + 1)] & kMaskTrained) != 0;
      targets[column] = keep ? tokens[static_cast<size_t>(k) + 1] : -100;
      trained += keep;
      positions[column] = k;
      starts[column] = column - k;
    }
  }
  // Padding after the last example: its own span, never a target.
  for (int64_t c = column; c < T; ++c) {
    inputs[c] = 0;
    targets[c] = -100;
    positions[c] = c - column;
    starts[c] = column;
  }
  return trained;
}

int64_t DataLoader::example_of(int64_t i) const {
  const int64_t n = pairs_ ? examples() / 2 : examples();
  return o_.shuffle ? permute_index(i % n, n, o_.seed, static_cast<uint64_t>(i / n)) : i % n;
}

int64_t DataLoader::example_length(int64_t e) const {
  const auto k = static_cast<size_t>(e);
  return (k + 1 < example_starts_.size() ? example_starts_[k + 1] : stream_->size()) - example_starts_[k];
}

int64_t DataLoader::tokens_in_files() const {
  int64_t n = stream_ ? stream_->size() : 0;
  for (const auto& part : parts_) n += part->tokens_in_files();
  return n;
}

size_t DataLoader::files() const {
  size_t n = stream_ ? stream_->files() : 0;
  for (const auto& part : parts_) n += part->files();
  return n;
}

int64_t DataLoader::examples() const {
  int64_t n = static_cast<int64_t>(example_starts_.size());
  for (const auto& part : parts_) n += part->examples();
  return n;
}

int64_t DataLoader::rows() const {
  if (!parts_.empty()) {
    int64_t n = 0;
    for (const auto& part : parts_) n += part->rows();
    return n;
  }
  return packed() ? static_cast<int64_t>(row_first_.size()) - 1 : pairs_ ? examples() / 2 : examples();
}

int64_t DataLoader::longest_example() const {
  int64_t longest = 0;
  for (const auto& part : parts_) longest = std::max(longest, part->longest_example());
  for (int64_t e = 0; e < static_cast<int64_t>(example_starts_.size()); ++e) longest = std::max(longest, example_length(e));
  return longest;
}

int64_t DataLoader::examples_longer_than_a_row() const {
  int64_t n = 0;
  for (const auto& part : parts_) n += part->examples_longer_than_a_row();
  for (int64_t e = 0; e < static_cast<int64_t>(example_starts_.size()); ++e) n += example_length(e) > o_.seq_len + 1;
  return n;
}

int64_t DataLoader::examples_training_nothing_in_a_row() const {
  int64_t n = 0;
  for (const auto& part : parts_) n += part->examples_training_nothing_in_a_row();
  for (int64_t e = 0; e < static_cast<int64_t>(example_starts_.size()); ++e) {
    const auto begin = static_cast<size_t>(example_starts_[static_cast<size_t>(e)]);
    const int64_t length = std::min(example_length(e), o_.seq_len + 1);
    bool trains = false;
    for (int64_t k = 1; k < length && !trains; ++k) trains = (mask_[begin + static_cast<size_t>(k)] & kMaskTrained) != 0;
    n += !trains;
  }
  return n;
}

void DataLoader::resume_at(int64_t step, int64_t tokens) {
  FSDP_CHECK(step >= 0 && tokens >= 0, "data: cannot resume at step ", step, " with ", tokens,
             " tokens seen: expected counts of zero or more");
  start_step_ = step;
  // Sequences start at multiples of T; a checkpoint from another sequence
  // length continues at the next whole sequence.
  const bool overflow = __builtin_add_overflow(tokens / o_.seq_len * o_.seq_len,
                                               tokens % o_.seq_len != 0 ? o_.seq_len : 0, &start_tokens_);
  FSDP_CHECK(!overflow, "data: the token position after ", tokens, " tokens seen is past what a 64-bit count holds; ",
             "the checkpoint's tokens_seen is not what a run reaches");
}

// Checked: the counts come from checkpoints and flags, and a position past
// int64 would read before the data's start.
int64_t DataLoader::offset(int64_t step, int micro_step) const {
  const int64_t BT = o_.batch_size * o_.seq_len;
  int64_t micro = 0, index = 0, tokens = 0, position = 0;
  const bool overflow = __builtin_mul_overflow(step - start_step_, static_cast<int64_t>(o_.grad_accum), &micro) ||
                        __builtin_add_overflow(micro, static_cast<int64_t>(micro_step), &micro) ||
                        __builtin_mul_overflow(micro, static_cast<int64_t>(o_.world), &index) ||
                        __builtin_add_overflow(index, static_cast<int64_t>(o_.rank), &index) ||
                        __builtin_mul_overflow(index, BT, &tokens) ||
                        __builtin_add_overflow(start_tokens_, tokens, &position) || position < 0;
  FSDP_CHECK(!overflow, "data: the token position of step ", step + 1, " (", start_tokens_,
             " tokens seen before step ", start_step_ + 1, ", then ", BT, " per rank and micro-step) is past what a ",
             "64-bit count holds; the checkpoint's tokens_seen or --steps is not what a run reaches");
  return position;
}

int64_t DataLoader::sequence_start(int64_t i) const {
  const int64_t T = o_.seq_len;
  if (!example_starts_.empty()) return example_starts_[static_cast<size_t>(example_of(i) * (pairs_ ? 2 : 1))];
  if (!o_.shuffle || !stream_) return i * T;
  const int64_t windows = (stream_->size() - 1) / T;
  const int64_t epoch = i / windows;
  return permute_index(i % windows, windows, o_.seed, static_cast<uint64_t>(epoch)) * T;
}

void DataLoader::read_example(int64_t e, int64_t* out, uint8_t* trained) const {
  const int64_t T = o_.seq_len;
  const int64_t start = example_starts_[static_cast<size_t>(e)];
  const int64_t length = std::min(example_length(e), T + 1);
  stream_->read(start, length, out);
  for (int64_t k = 0; k <= T; ++k) {
    if (k >= length) out[k] = 0;  // padding: never a target, after every real token
    trained[k] = k < length && (mask_[static_cast<size_t>(start + k)] & kMaskTrained);
  }
}

std::vector<int64_t> DataLoader::examples_of_batch(int64_t first) const {
  const int64_t B = o_.batch_size;
  std::vector<int64_t> out;
  if (!pairs_) {
    for (int64_t b = 0; b < B; ++b) out.push_back(example_of(first + b));
    return out;
  }
  // TRL's order: every pair's chosen row, then every pair's rejected row.
  for (int side = 0; side < 2; ++side) {
    for (int64_t b = 0; b < B; ++b) out.push_back(2 * example_of(first + b) + side);
  }
  return out;
}

void DataLoader::read_sequence(int64_t i, int64_t* out, uint8_t* trained) const {
  const int64_t T = o_.seq_len;
  const int64_t start = sequence_start(i);
  if (!example_starts_.empty()) {
    read_example(example_of(i), out, trained);
    return;
  }
  if (stream_) {
    stream_->read(start % stream_->size(), T + 1, out);
    return;
  }
  // An endless virtual file: the token at position p is a hash of (seed, p),
  // so synthetic runs keep the data-order contract at any world size too.
  for (int64_t k = 0; k <= T; ++k) {
    out[k] = static_cast<int64_t>(splitmix64(o_.seed ^ static_cast<uint64_t>(start + k)) %
                                  static_cast<uint64_t>(o_.vocab_size));
  }
}

std::vector<int32_t> DataLoader::sample_prompt(int64_t k, int64_t tokens) const {
  if (schedule_) {
    const auto [d, j] = schedule_->locate(k);
    return parts_[static_cast<size_t>(d)]->sample_prompt(j % parts_[static_cast<size_t>(d)]->rows(), tokens);
  }
  FSDP_CHECK(stream_ != nullptr, "sample_prompt: synthetic data has no prompts");
  int64_t begin = 0, length = 0;
  if (!example_starts_.empty()) {
    const int64_t e = pairs_ ? 2 * k : k;
    begin = example_starts_[static_cast<size_t>(e)];
    const int64_t whole = example_length(e);
    while (length < whole && !(mask_[static_cast<size_t>(begin + length)] & kMaskTrained)) ++length;
  } else {
    begin = k * o_.seq_len;
    length = std::min(tokens, stream_->size() - begin);
  }
  if (length > tokens) {
    begin += length - tokens;
    length = tokens;
  }
  std::vector<int64_t> read(static_cast<size_t>(std::max<int64_t>(length, 0)));
  if (length > 0) stream_->read(begin, length, read.data());
  return {read.begin(), read.end()};
}

Batch DataLoader::batch(int64_t step, int micro_step) const {
  const int64_t B = o_.batch_size, T = o_.seq_len;
  if (packed()) {
    Batch out;
    out.inputs = torch::empty({B, T}, torch::kLong);
    out.targets = torch::empty({B, T}, torch::kLong);
    out.positions = torch::empty({B, T}, torch::kLong);
    out.example_starts = torch::empty({B, T}, torch::kLong);
    const int64_t first = offset(step, micro_step) / T;
    for (int64_t b = 0; b < B; ++b) {
      out.trained_targets +=
          read_packed(first + b, out.inputs[b].data_ptr<int64_t>(), out.targets[b].data_ptr<int64_t>(),
                      out.positions[b].data_ptr<int64_t>(), out.example_starts[b].data_ptr<int64_t>());
    }
    for (int64_t b = 0; b < B; ++b) {
      const auto r = static_cast<size_t>(row_of(first + b));
      for (int64_t e = row_first_[r]; e < row_first_[r + 1]; ++e) out.real_tokens += std::min(example_length(e), T + 1) - 1;
    }
    if (!o_.device.is_cpu()) {
      out.inputs = out.inputs.to(o_.device);
      out.targets = out.targets.to(o_.device);
      out.positions = out.positions.to(o_.device);
    }
    return out;
  }
  const int64_t first = offset(step, micro_step) / T;
  // Chat data: the examples of the batch's rows (two a sequence for
  // preference pairs); a mixture's rows come from its sources.
  const bool chat = examples() > 0;
  const std::vector<int64_t> row_examples =
      chat && !schedule_ ? examples_of_batch(first) : std::vector<int64_t>{};
  const int64_t R = row_examples.empty() ? B : static_cast<int64_t>(row_examples.size());
  auto rows = torch::empty({R, T + 1}, torch::kLong);
  std::vector<uint8_t> trained(static_cast<size_t>(R * (T + 1)), 1);
  int64_t real = chat ? 0 : B * T, longest = 1;
  for (int64_t b = 0; b < R; ++b) {
    int64_t* row = rows[b].data_ptr<int64_t>();
    uint8_t* row_trained = trained.data() + b * (T + 1);
    int64_t inputs_of_row = T;
    if (schedule_) {
      // [Note: a mixture's schedule]
      const auto [d, j] = schedule_->locate(first + b);
      const DataLoader& part = *parts_[static_cast<size_t>(d)];
      part.read_sequence(j, row, row_trained);
      if (chat) inputs_of_row = std::min(part.example_length(part.example_of(j)), T + 1) - 1;
    } else if (chat) {
      const int64_t e = row_examples[static_cast<size_t>(b)];
      read_example(e, row, row_trained);
      inputs_of_row = std::min(example_length(e), T + 1) - 1;
    } else {
      read_sequence(first + b, row, row_trained);
    }
    if (chat) {
      real += inputs_of_row;
      longest = std::max(longest, inputs_of_row);
    }
  }
  // A copy (with B = 1 the narrowed rows count as contiguous already, and
  // the ignore index written below would reach the inputs).
  auto targets = rows.narrow(1, 1, T).clone(at::MemoryFormat::Contiguous);
  int64_t counted = B * T;
  if (chat) {
    counted = 0;
    auto* t = targets.data_ptr<int64_t>();
    for (int64_t b = 0; b < R; ++b) {
      for (int64_t k = 0; k < T; ++k) {
        const bool keep = trained[static_cast<size_t>(b * (T + 1) + k + 1)] != 0;
        if (!keep) t[b * T + k] = -100;
        counted += keep;
      }
    }
  }
  // Chat data is padded to the micro-batch's longest row, not to T
  // ([Note: padding to the batch]).
  const int64_t width = chat ? std::min(T, (longest + kPadMultiple - 1) / kPadMultiple * kPadMultiple) : T;
  auto inputs = rows.narrow(1, 0, width).contiguous();
  if (width < T) targets = targets.narrow(1, 0, width).contiguous();
  if (!o_.device.is_cpu()) {
    inputs = inputs.to(o_.device);
    targets = targets.to(o_.device);
  }
  Batch out{inputs, targets, counted};
  out.real_tokens = real;
  return out;
}

}  // namespace fsdp::data
