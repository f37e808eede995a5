// Activation checkpointing and the chunked loss change memory, not math:
// the same loss and the same gradients as the plain forms.

#include <gtest/gtest.h>

#include "fsdp/models/registry.h"
#include "fsdp/nn/lm_loss.h"

namespace fsdp::models {
namespace {

struct LossAndGrads {
  double loss;
  std::vector<torch::Tensor> grads;
};

LossAndGrads run(const std::string& preset, double dropout, bool checkpoint, bool chunked) {
  torch::manual_seed(11);
  auto model = build_preset(preset, dropout);
  model->set_activation_checkpointing(checkpoint);
  auto tokens = torch::randint(0, model->vocab_size(), {3, 17}, torch::kLong);
  torch::manual_seed(99);  // the dropout masks
  auto hidden = model->forward(tokens.narrow(1, 0, 16));
  auto targets = tokens.narrow(1, 1, 16);
  auto loss = chunked ? nn::chunked_lm_loss(hidden, model->output_weight(), targets, 7)
                      : nn::lm_loss(hidden, model->output_weight(), targets);
  loss.backward();
  LossAndGrads out{loss.item<double>(), {}};
  for (const auto& p : model->parameters()) out.grads.push_back(p.grad().clone());
  return out;
}

void expect_same(const LossAndGrads& a, const LossAndGrads& b, double tol) {
  EXPECT_NEAR(a.loss, b.loss, tol * std::abs(b.loss));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a.grads[i], b.grads[i], tol, 1e-7)) << "gradient " << i << " differs by "
                                                                     << (a.grads[i] - b.grads[i]).abs().max().item<double>();
  }
}

class PerFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(PerFamily, ActivationCheckpointingWithDropoutGivesTheSameLossAndGradients) {
  // Dropout 0.1: the recomputation must draw the same masks as the forward.
  expect_same(run(GetParam(), 0.1, true, false), run(GetParam(), 0.1, false, false), 1e-6);
}

TEST_P(PerFamily, ChunkedLossGivesTheSameLossAndGradients) {
  expect_same(run(GetParam(), 0.0, false, true), run(GetParam(), 0.0, false, false), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Families, PerFamily, ::testing::Values("gpt2-tiny", "llama-tiny"),
                         [](const auto& info) { return info.param == "gpt2-tiny" ? "gpt2" : "llama"; });

}  // namespace
}  // namespace fsdp::models
