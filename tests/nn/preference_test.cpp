// DPO's pieces, each against a computation written out here: a sequence's
// log-likelihood, the loss on a pair's margin, and the base a LoRA layer
// computes with its adapters off.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "fsdp/nn/layers.h"
#include "fsdp/nn/lm_loss.h"
#include "fsdp/nn/lora.h"
#include "fsdp/train/preference.h"

namespace fsdp::train::preference_test {
namespace {

TEST(SequenceLogProbs, SumsEachRowsTrainedTargetsUnderTheSoftmax) {
  torch::manual_seed(3);
  const auto hidden = torch::randn({2, 3, 4});
  const auto weight = torch::randn({5, 4});
  const auto targets = torch::tensor({{1, -100, 4}, {-100, -100, 0}}, torch::kLong);
  const auto sums = nn::sequence_log_probs(hidden, weight, targets);
  for (int64_t b = 0; b < 2; ++b) {
    double expected = 0;
    for (int64_t t = 0; t < 3; ++t) {
      const int64_t target = targets[b][t].item<int64_t>();
      if (target < 0) continue;
      const auto logits = torch::mv(weight, hidden[b][t]);
      double norm = 0;
      for (int64_t v = 0; v < 5; ++v) norm += std::exp(logits[v].item<double>());
      expected += logits[target].item<double>() - std::log(norm);
    }
    EXPECT_NEAR(sums[b].item<double>(), expected, 1e-5) << "row " << b;
  }
}

TEST(SequenceLogProbs, GradientsEqualAutogradThroughLogSoftmax) {
  // The fused form's backward (each row scaled by its sequence's incoming
  // gradient) against autograd through the plain operators.
  torch::manual_seed(4);
  const auto hidden = torch::randn({3, 5, 6}, torch::requires_grad());
  const auto weight = torch::randn({11, 6}, torch::requires_grad());
  const auto targets = torch::randint(0, 11, {3, 5}).masked_fill(torch::rand({3, 5}).lt(0.3), -100);
  const auto coefficient = torch::tensor({0.5, -2.0, 1.5});
  (nn::sequence_log_probs(hidden, weight, targets) * coefficient).sum().backward();
  const auto h = hidden.detach().clone().requires_grad_(), w = weight.detach().clone().requires_grad_();
  const auto ignored = targets.eq(-100);
  const auto picked = torch::log_softmax(torch::matmul(h, w.t()), -1)
                          .gather(-1, targets.masked_fill(ignored, 0).unsqueeze(-1))
                          .squeeze(-1)
                          .masked_fill(ignored, 0.0);
  (picked.sum(-1) * coefficient).sum().backward();
  EXPECT_TRUE(torch::allclose(hidden.grad(), h.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(weight.grad(), w.grad(), 1e-5, 1e-5));
}

TEST(PreferenceLoss, SigmoidIpoAndHingeOnAPairWorkedByHand) {
  // One pair: policy log-probs chosen -10, rejected -12; reference -11 and
  // -11. Log-ratios +1 and -1, margin 2; answers of 4 and 2 tokens.
  const auto policy = torch::tensor({-10.0, -12.0}, torch::kDouble);
  const auto reference = torch::tensor({-11.0, -11.0}, torch::kDouble);
  const auto tokens = torch::tensor({4, 2}, torch::kLong);
  TrainConfig::Objective o;
  o.name = ObjectiveKind::kDpo;
  o.beta = 0.5;
  const auto log_sigmoid = [](double x) { return -std::log1p(std::exp(-x)); };

  auto t = preference_terms(policy, reference, tokens, o);
  EXPECT_NEAR(t.losses[0].item<double>(), -log_sigmoid(0.5 * 2), 1e-12);
  EXPECT_NEAR(t.chosen_rewards[0].item<double>(), 0.5, 1e-12);
  EXPECT_NEAR(t.rejected_rewards[0].item<double>(), -0.5, 1e-12);

  o.label_smoothing = 0.2;  // cDPO: 0.8 of the pair as labelled, 0.2 flipped
  t = preference_terms(policy, reference, tokens, o);
  EXPECT_NEAR(t.losses[0].item<double>(), -0.8 * log_sigmoid(1.0) - 0.2 * log_sigmoid(-1.0), 1e-12);

  o.label_smoothing = 0;
  o.loss = DpoLoss::kIpo;  // per-token log-ratios: 1/4 - (-1/2) = 0.75; target 1 / (2 beta) = 1
  t = preference_terms(policy, reference, tokens, o);
  EXPECT_NEAR(t.losses[0].item<double>(), (0.75 - 1.0) * (0.75 - 1.0), 1e-12);

  o.loss = DpoLoss::kHinge;  // relu(1 - beta * margin) = relu(0)
  t = preference_terms(policy, reference, tokens, o);
  EXPECT_NEAR(t.losses[0].item<double>(), 0.0, 1e-12);
  o.beta = 0.1;
  t = preference_terms(policy, reference, tokens, o);
  EXPECT_NEAR(t.losses[0].item<double>(), 0.8, 1e-12);
}

TEST(PreferenceStats, MeansAreOverEveryPairScored) {
  TrainConfig::Objective o;
  o.beta = 1;
  PreferenceStats stats;
  // Two batches (chosen rows, then rejected): log-ratios chosen (1, 0),
  // rejected (-1, 0): margins 2 (won) and 0 (a tie, not won); then chosen
  // 0, rejected -1: margin 1 (won).
  stats.add(preference_terms(torch::tensor({-1.0, -2.0, -3.0, -2.0}, torch::kDouble),
                             torch::tensor({-2.0, -2.0, -2.0, -2.0}, torch::kDouble),
                             torch::tensor({1, 1, 1, 1}), o));
  stats.add(preference_terms(torch::tensor({-1.0, -2.0}, torch::kDouble), torch::tensor({-1.0, -1.0}, torch::kDouble),
                             torch::tensor({1, 1}), o));
  const auto means = stats.means();
  ASSERT_EQ(means[2].first, "rewards/accuracies");
  EXPECT_NEAR(means[2].second, 2.0 / 3.0, 1e-12);
  ASSERT_EQ(means[3].first, "rewards/margins");
  EXPECT_NEAR(means[3].second, (2.0 + 0.0 + 1.0) / 3.0, 1e-12);
}

TEST(AdaptersOff, AnAdaptedLayerComputesItsBaseAlone) {
  torch::manual_seed(5);
  struct Net : torch::nn::Module {
    nn::Linear q_proj{nullptr};
    Net() { q_proj = register_module("q_proj", nn::Linear(6, 4, true)); }
  };
  Net net;
  nn::LoraOptions options;
  options.rank = 2;
  nn::add_lora(net, options);
  {
    torch::NoGradGuard no_grad;
    net.q_proj->lora_B->weight.normal_(0, 0.5);  // a trained adapter: it changes the output
  }
  const auto x = torch::randn({3, 6});
  const auto base = torch::nn::functional::linear(x, net.q_proj->weight, net.q_proj->bias);
  EXPECT_GT((net.q_proj->forward(x) - base).abs().max().item<double>(), 1e-3);
  {
    nn::AdaptersOff off;
    EXPECT_TRUE(torch::equal(net.q_proj->forward(x), base));
  }
  EXPECT_GT((net.q_proj->forward(x) - base).abs().max().item<double>(), 1e-3);  // on again
}

}  // namespace
}  // namespace fsdp::train::preference_test
