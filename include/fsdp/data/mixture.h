#pragma once
// Weighted mixing of datasets at train time (`--data A:0.7,B:0.3`), as
// Megatron's BlendedDataset and torchtitan's mixtures draw from several
// sources. Light header: no LibTorch.
//
// [Note: a mixture's schedule]
// The global stream of sequences (the data-order contract's index i) is
// cut into periods of P = 1000 slots. Each source gets n_d slots a period,
// its weight's share of P (largest remainders, every source at least one),
// in an order fixed once by smooth weighted round-robin (slot s goes to the
// source furthest behind its share s * n_d / P), so the sources interleave
// evenly within a period rather than in runs. Sequence i then reads source
// d = order[i mod P] at that source's own index (i / P) * n_d + (the slots
// of d before i's in the period): each source is read from its first
// sequence on, in its own order (its own shuffle), exactly once before
// any repeats. No state: the same i gives the same (d, index) at any world
// size and after any resume, as a single source's stream does.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::data {

struct WeightedSource {
  std::string source;  // a token file spec (a file or a glob)
  double weight = 0;
};

// "A:0.7,B:0.3" as its sources and weights; a spec without weights ("A",
// "A,B", "train_*.bin") as an empty list. Throws fsdp::Error naming FLAG for
// a spec that weights some sources and not others, and for a weight that
// is not a positive number or leaves a source less than one slot in 1000.
std::vector<WeightedSource> parse_mixture(const std::string& spec, const std::string& flag);

// The token file spec of every source of SPEC, weights dropped.
std::string mixture_paths(const std::string& spec, const std::string& flag);

class MixtureSchedule {
 public:
  static constexpr int64_t kPeriod = 1000;
  explicit MixtureSchedule(const std::vector<double>& weights);
  // Global sequence i: (source, that source's sequence index).
  std::pair<int, int64_t> locate(int64_t i) const;
  // Slots each source gets in a period of kPeriod.
  const std::vector<int64_t>& slots() const { return slots_; }

 private:
  std::vector<int64_t> slots_;
  std::vector<int> order_;          // source of each slot of a period
  std::vector<int64_t> earlier_;    // slots of the same source before it, in the period
};

}  // namespace fsdp::data
