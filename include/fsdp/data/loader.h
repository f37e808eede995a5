#pragma once
// Batches in the order every world size agrees on (the data-order contract).
// The token stream is the concatenation of the token files in the order
// given (or an endless synthetic stream). Rank r of W data-parallel ranks,
// at optimizer step s and micro-step a of A, reads row b of its batch from
// sequence i = (start + ((s - s0)*A + a)*W*B*T + r*B*T) / T + b of the
// stream, where (s0, start) is where the run began: step 0 and token 0, or
// the step and tokens consumed at a resumed checkpoint, so no token is read
// twice or skipped even when batch size, accumulation or world size changed.
// Unshuffled, sequence i is the T+1 tokens from position i*T (wrapping at
// the end of the stream). With shuffle, the stream is cut into windows of
// T+1 tokens and sequence i reads window pi_e(i mod n), where pi_e is a
// seeded permutation of the n windows for epoch e = i / n, computed without
// state. Either way a run at W=2 sees exactly the global batch of W=1.
//
// Chat data (token files `fsdp data prepare` wrote with loss masks beside
// them, fsdp/data/loss_mask.h) is read as whole examples instead: sequence
// i is example i mod n (pi_e(i mod n) with shuffle), one to a row, from its
// first token: an example longer than T+1 tokens is cut to its first T+1
// (the rest is never trained on), a shorter one padded. A micro-batch is
// padded to its longest row, rounded up to a multiple of 8 (at most T),
// not to T, as TRL's collator pads to the batch's longest: its inputs are
// (B, T') with T' <= T. Targets the mask does not cover, and padding, are
// -100 (the loss's ignore index); every row starts at position 0 and
// attends to its own example alone. The positions above count T tokens
// per row, so resuming works alike.
//
// Packed (LoaderOptions::pack), a row holds consecutive examples, as many
// as fit: each example of L tokens (cut to T+1) puts its first L-1 tokens
// in the row as inputs and its last L-1 as their targets, so the T inputs
// of a row hold any examples whose L-1 add up to T at most, and no target
// crosses from one example into the next. The rows are made once, in file
// order, and sequence i is row i mod n (pi_e(i mod n) with shuffle). Each
// batch then carries every token's position in its example and the column
// its example starts at (nn/packed_rows.h), which the model's
// positions and attention read.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "fsdp/data/mixture.h"
#include "fsdp/data/token_file.h"

namespace fsdp::data {

struct Batch {
  torch::Tensor inputs;   // (B, T) int64
  torch::Tensor targets;  // (B, T) int64; -100 where nothing is trained (chat data)
  int64_t trained_targets = 0;  // targets other than -100
  // Input tokens that are data, not padding: B x T for a token stream,
  // each row's example (or examples, packed) for chat data.
  int64_t real_tokens = 0;
  // Packed rows only: (B, T) int64, each token's position in its example
  // (on the batch's device) and the column its example starts at (CPU).
  torch::Tensor positions, example_starts;
};

struct LoaderOptions {
  int64_t batch_size = 1, seq_len = 1;
  int rank = 0, world = 1, grad_accum = 1;
  int64_t vocab_size = 0;
  uint64_t seed = 0;
  bool shuffle = false;
  bool pack = false;  // chat data: several examples to a row
  c10::Device device = c10::Device(c10::DeviceType::CPU);  // where batches go (the world's device)
  std::string flag = "--data";  // names the option in errors
  // Appended to the error for a token id the vocabulary cannot hold
  // (given the largest id): what the caller's user can change.
  std::function<std::string(int64_t max_id)> vocab_advice;
};

class DataLoader {
 public:
  // `source` names token files (see expand_token_paths) or is "synthetic"
  // (tokens hashed from `seed` and their position in an endless stream).
  // Token ids must be below vocab_size.
  DataLoader(const std::string& source, const LoaderOptions& options);

  // Continue from a checkpoint taken after `step` steps and `tokens`
  // consumed tokens.
  void resume_at(int64_t step, int64_t tokens);
  Batch batch(int64_t step, int micro_step) const;
  // Where batch(step, micro) starts in the token stream (for the contract's tests).
  int64_t offset(int64_t step, int micro_step) const;
  bool synthetic() const { return stream_ == nullptr && parts_.empty(); }
  int64_t tokens_in_files() const;
  size_t files() const;
  // A mixture (`--data A:0.7,B:0.3`, data/mixture.h): its sources.
  size_t sources() const { return parts_.empty() ? 1 : parts_.size(); }
  // The stream window sequence i reads (its first token's position).
  int64_t sequence_start(int64_t i) const;
  // Chat data: the number of examples (0: a token stream), the longest,
  // and how many are longer than one row (T+1 tokens) holds.
  // A mixture's counts (examples, rows and the three below) are its
  // sources' together.
  int64_t examples() const;
  // Chat data: the rows an epoch reads (packed rows, or one per example).
  int64_t rows() const;
  // Preference data (`data prepare` of {"prompt", "chosen", "rejected"}
  // records): sequence i is pair i, and a micro-batch of B pairs is 2B
  // rows, the B chosen examples and then the B rejected ones, as TRL's
  // DataCollatorForPreference lays them out.
  bool preference_pairs() const { return pairs_; }
  // A prompt to complete from row k of the data (k below rows()): chat
  // data, the example (a pair's chosen one) up to its first trained token;
  // a token stream, the first `tokens` tokens of window k. At most `tokens`
  // tokens either way, the last ones kept.
  std::vector<int32_t> sample_prompt(int64_t k, int64_t tokens) const;
  bool packed() const { return !row_first_.empty(); }
  int64_t longest_example() const;
  int64_t examples_longer_than_a_row() const;
  // How many examples train no token within a row (T + 1 tokens): their
  // answers start past the cut (or they have none).
  int64_t examples_training_nothing_in_a_row() const;

 private:
  void read_sequence(int64_t i, int64_t* out, uint8_t* trained) const;
  // Packed row i's inputs, targets (-100 untrained), positions and starts (T each); returns its trained targets.
  int64_t read_packed(int64_t i, int64_t* inputs, int64_t* targets, int64_t* positions, int64_t* starts) const;
  int64_t row_of(int64_t i) const;  // the packed row sequence i reads
  // The example sequence i reads (chat data); the pair, for preference pairs.
  int64_t example_of(int64_t i) const;
  void read_example(int64_t e, int64_t* out, uint8_t* trained) const;  // T + 1 tokens, padded
  // The examples of the rows of the batch whose first sequence is FIRST.
  std::vector<int64_t> examples_of_batch(int64_t first) const;
  int64_t example_length(int64_t e) const;
  std::shared_ptr<TokenStream> stream_;
  std::vector<uint8_t> mask_;             // chat data: the masks of the whole stream
  std::vector<int64_t> example_starts_;  // chat data: where each example starts in the stream
  std::vector<int64_t> row_first_;       // packed: row r holds examples [row_first_[r], row_first_[r + 1])
  bool pairs_ = false;
  // A mixture: a loader for each source and the schedule that interleaves them.
  std::vector<std::unique_ptr<DataLoader>> parts_;
  std::unique_ptr<MixtureSchedule> schedule_;
  LoaderOptions o_;
  int64_t start_step_ = 0, start_tokens_ = 0;
};

// A bijection of [0, n) keyed by (seed, epoch): a Feistel network over the
// next power of four with cycle-walking. Exposed for tests.
int64_t permute_index(int64_t i, int64_t n, uint64_t seed, uint64_t epoch);

}  // namespace fsdp::data
