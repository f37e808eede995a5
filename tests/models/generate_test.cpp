// train::generate's choices, each against an independent run: nucleus
// sampling with a vanishing p is greedy decoding, with p = 1 it is plain
// sampling, and a stop id ends the text right after it, as transformers'
// eos_token_id does.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fsdp/models/registry.h"
#include "fsdp/train/generate.h"

namespace fsdp::train {
namespace {

models::CausalLM model() {
  torch::manual_seed(0);
  return models::build_preset("gpt2-tiny");
}

const std::vector<int32_t> kPrompt{5, 17, 42};

SampleOptions greedy(int64_t tokens) {
  SampleOptions o;
  o.max_new_tokens = tokens;
  o.temperature = 0;
  return o;
}

// Drawn from the whole distribution: temperature 1, no top-k.
SampleOptions sampled(int64_t tokens) {
  SampleOptions o;
  o.max_new_tokens = tokens;
  o.temperature = 1.0;
  o.top_k = 0;
  return o;
}

TEST(Generate, TopPSoSmallThatOneTokenRemainsIsGreedy) {
  const auto m = model();
  SampleOptions nucleus = sampled(16);
  nucleus.top_p = 1e-9;
  EXPECT_EQ(generate(m, kPrompt, nucleus), generate(m, kPrompt, greedy(16)));
}

TEST(Generate, TopPOfOneSamplesAsWithoutIt) {
  const auto m = model();
  const SampleOptions all = sampled(16);
  SampleOptions nucleus = all;
  nucleus.top_p = 1.0;
  const auto sampled = generate(m, kPrompt, all);
  EXPECT_EQ(generate(m, kPrompt, nucleus), sampled);
  // And a p below 1 changes what is drawn somewhere in 16 draws from 512
  // tokens of a random model (its distribution is nearly flat).
  nucleus.top_p = 0.05;
  EXPECT_NE(generate(m, kPrompt, nucleus), sampled);
}

TEST(Generate, AStopIdEndsTheTextAfterIt) {
  const auto m = model();
  const auto full = generate(m, kPrompt, greedy(12));
  ASSERT_EQ(full.size(), 12u);
  // The first occurrence of the fourth token decides where it stops.
  const int32_t stop = full[3];
  const auto first = std::find(full.begin(), full.end(), stop) - full.begin();
  auto o = greedy(12);
  o.stop_ids = {stop, 511};
  const auto stopped = generate(m, kPrompt, o);
  EXPECT_EQ(stopped, std::vector<int32_t>(full.begin(), full.begin() + first + 1));
}

TEST(Generate, AStopPredicateEndsTheTextWhereItFirstHolds) {
  const auto m = model();
  const auto full = generate(m, kPrompt, greedy(12));
  auto o = greedy(12);
  std::vector<size_t> asked;
  o.stop_when = [&](const std::vector<int32_t>& ids) {
    asked.push_back(ids.size());
    return ids.size() == 5;
  };
  EXPECT_EQ(generate(m, kPrompt, o), std::vector<int32_t>(full.begin(), full.begin() + 5));
  EXPECT_EQ(asked, (std::vector<size_t>{1, 2, 3, 4, 5})) << "asked after each token with all of them";
}

}  // namespace
}  // namespace fsdp::train
