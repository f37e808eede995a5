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

namespace fsdp::train {
namespace {

// The logits at every position of `ids`, from one forward of the whole text.
torch::Tensor whole_text_logits(const models::CausalLM& m, const std::vector<int64_t>& ids) {
  auto tokens = torch::tensor(ids, torch::kLong).unsqueeze(0);
  return m->forward(tokens).matmul(m->output_weight().t()).squeeze(0);  // (T, V)
}

// A key/value cache gives what running the whole text gives: fed as a
// prompt of 7, single tokens, then a chunk of 3 (a query block that must
// not see its own future), and single tokens again, every position's
// logits equal the whole text's, in every family that reads the cache.
TEST(Generate, TheKeyValueCacheGivesTheLogitsOfRunningTheWholeText) {
  torch::NoGradGuard no_grad;
  for (const std::string preset : {"gpt2-tiny", "llama-tiny", "llama2-tiny", "qwen3-tiny", "qwen3-moe-tiny"}) {
    torch::manual_seed(3);
    const auto m = models::build_preset(preset);
    m->eval();
    ASSERT_TRUE(m->supports_kv_cache()) << preset;
    std::vector<int64_t> ids;
    for (int i = 0; i < 20; ++i) ids.push_back((i * 37 + 11) % 500);
    const auto expected = whole_text_logits(m, ids);
    models::KvCache cache;
    cache.capacity = m->max_seq_len();
    m->kv_cache = &cache;
    std::vector<torch::Tensor> pieces;
    for (const int64_t chunk : {7, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1}) {
      const auto fed = torch::tensor(std::vector<int64_t>(ids.begin() + cache.length, ids.begin() + cache.length + chunk),
                                     torch::kLong)
                           .unsqueeze(0);
      pieces.push_back(m->forward(fed).matmul(m->output_weight().t()).squeeze(0));
      cache.length += chunk;
    }
    m->kv_cache = nullptr;
    ASSERT_EQ(cache.length, 20);
    const auto got = torch::cat(pieces);
    const double scale = expected.abs().max().item<double>();
    EXPECT_LT((got - expected).abs().max().item<double>(), 1e-5 * scale) << preset;
  }
}

// Greedy decoding through generate (with the cache, and past the model's
// 64 positions, where the text slides through the window) picks what
// greedy decoding over the whole text picks, computed here step by step.
TEST(Generate, GreedyWithTheCacheEqualsGreedyOverTheWholeTextAndSlidesPastTheWindow) {
  torch::NoGradGuard no_grad;
  for (const std::string preset : {"gpt2-tiny", "llama-tiny"}) {
    torch::manual_seed(5);
    const auto m = models::build_preset(preset);
    const int64_t window = m->max_seq_len();
    const auto got = generate(m, kPrompt, greedy(window + 10));
    m->eval();
    std::vector<int64_t> ids(kPrompt.begin(), kPrompt.end());
    std::vector<int32_t> expected;
    for (int64_t i = 0; i < window + 10; ++i) {
      const int64_t context = std::min<int64_t>(static_cast<int64_t>(ids.size()), window);
      const auto logits = whole_text_logits(m, std::vector<int64_t>(ids.end() - context, ids.end()));
      const int64_t next = logits[context - 1].argmax().item<int64_t>();
      ids.push_back(next);
      expected.push_back(static_cast<int32_t>(next));
    }
    EXPECT_EQ(got, expected) << preset;
  }
}

}  // namespace
}  // namespace fsdp::train
