// Activation checkpointing and the chunked loss change memory, not math:
// the same loss and the same gradients as the plain forms. And the fused
// loss (head matmul plus cross-entropy, one pass per row) against
// LibTorch's own cross_entropy of the logits.

#include <atomic>
#include <cstring>

#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include "fsdp/common/error.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/lm_loss.h"

namespace fsdp::models::loss_equivalence_test {
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
    EXPECT_TRUE(torch::allclose(a.grads[i], b.grads[i], tol, 1e-7))
        << "gradient " << i << " differs by " << (a.grads[i] - b.grads[i]).abs().max().item<double>();
  }
}

// Counts the dispatcher's calls of one operator, on every thread, while it lives.
class OpCounter {
 public:
  explicit OpCounter(const char* op) {
    op_ = op;
    count_ = 0;
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&OpCounter::seen));
  }
  ~OpCounter() { at::removeCallback(handle_); }
  int count() const { return count_; }

 private:
  static std::unique_ptr<at::ObserverContext> seen(const at::RecordFunction& fn) {
    if (std::strcmp(fn.name(), op_) == 0) ++count_;
    return nullptr;
  }
  static inline const char* op_ = nullptr;
  static inline std::atomic<int> count_{0};
  at::CallbackHandle handle_;
};

// The operator each block's MLP calls once in forward, never in backward,
// and nothing outside the blocks calls: its activation.
const char* activation_op(const std::string& preset) {
  return preset == "gpt2-tiny" ? "fsdp::gelu_tanh" : "fsdp::silu_mul";
}

class PerFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(PerFamily, ActivationCheckpointingWithDropoutGivesTheSameLossAndGradients) {
  // Dropout 0.1: the recomputation must draw the same masks as the forward.
  expect_same(run(GetParam(), 0.1, true, false), run(GetParam(), 0.1, false, false), 1e-6);
  // The premises: dropout is active (the loss differs from p = 0), and the
  // blocks are recomputed (each block's activation runs twice in forward
  // and backward with checkpointing, once without).
  EXPECT_GT(std::abs(run(GetParam(), 0.1, false, false).loss - run(GetParam(), 0.0, false, false).loss), 1e-4);
  const int64_t layers = build_preset(GetParam())->n_layers();
  int once = 0, twice = 0;
  {
    OpCounter counter(activation_op(GetParam()));
    run(GetParam(), 0.1, false, false);
    once = counter.count();
  }
  {
    OpCounter counter(activation_op(GetParam()));
    run(GetParam(), 0.1, true, false);
    twice = counter.count();
  }
  EXPECT_EQ(once, layers);
  EXPECT_EQ(twice, 2 * layers) << "checkpointed blocks did not run their forward again in backward";
}

TEST_P(PerFamily, ChunkedLossGivesTheSameLossAndGradients) {
  expect_same(run(GetParam(), 0.0, false, true), run(GetParam(), 0.0, false, false), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Families, PerFamily, ::testing::Values("gpt2-tiny", "llama-tiny"),
                         [](const auto& info) { return info.param == "gpt2-tiny" ? "gpt2" : "llama"; });

struct HeadCase {
  torch::Tensor hidden, weight, targets;
};

// Rows of hidden states against a vocabulary of 1,000, some targets
// ignored (-100, as cross_entropy's default), logits spread over about
// +-60 so the softmax has both saturated and flat rows.
HeadCase head_case(torch::ScalarType dtype) {
  torch::manual_seed(5);
  HeadCase c;
  c.hidden = (torch::randn({37, 24}) * 3).to(dtype).requires_grad_();
  c.weight = (torch::randn({1000, 24}) * torch::rand({1000, 1}) * 2).to(dtype).requires_grad_();
  c.targets = torch::randint(0, 1000, {37}, torch::kLong);
  c.targets.index_put_({torch::tensor({3, 20, 21})}, -100);
  return c;
}

struct HeadResult {
  double loss;
  torch::Tensor grad_hidden, grad_weight;
};

// The loss times 0.25, as gradient accumulation over four micro-steps
// scales it, so backward sees a gradient output other than 1.
HeadResult run_head(const HeadCase& c, const std::function<torch::Tensor(const HeadCase&)>& loss_of) {
  HeadCase mine{c.hidden.detach().clone().requires_grad_(), c.weight.detach().clone().requires_grad_(), c.targets};
  auto loss = loss_of(mine);
  (loss * 0.25).backward();
  return {loss.item<double>(), mine.hidden.grad(), mine.weight.grad()};
}

HeadResult reference(const HeadCase& c) {
  return run_head(c, [](const HeadCase& m) {
    const auto logits = m.hidden.matmul(m.weight.t());
    return torch::nn::functional::cross_entropy(
        logits.scalar_type() == torch::kBFloat16 ? logits.to(torch::kFloat) : logits, m.targets);
  });
}

void expect_close(const HeadResult& a, const HeadResult& b, double rtol, double atol) {
  EXPECT_NEAR(a.loss, b.loss, rtol * std::abs(b.loss));
  EXPECT_EQ(a.grad_hidden.scalar_type(), b.grad_hidden.scalar_type());
  EXPECT_EQ(a.grad_weight.scalar_type(), b.grad_weight.scalar_type());
  const auto gap = [](const torch::Tensor& x, const torch::Tensor& y) {
    return (x.to(torch::kFloat) - y.to(torch::kFloat)).abs().max().item<double>();
  };
  EXPECT_TRUE(torch::allclose(a.grad_hidden.to(torch::kFloat), b.grad_hidden.to(torch::kFloat), rtol, atol))
      << "hidden gradient differs by " << gap(a.grad_hidden, b.grad_hidden);
  EXPECT_TRUE(torch::allclose(a.grad_weight.to(torch::kFloat), b.grad_weight.to(torch::kFloat), rtol, atol))
      << "weight gradient differs by " << gap(a.grad_weight, b.grad_weight);
}

double max_gap(const torch::Tensor& x, const torch::Tensor& y) {
  return (x.to(torch::kDouble) - y.to(torch::kDouble)).abs().max().item<double>();
}

// Judged against the same head in fp64: BLAS libraries sum the head's 1,000
// products per row in different orders (OpenBLAS under Debian's LibTorch
// 1.13, MKL in PyTorch's wheels), so two fp32 computations differ by
// rounding alone. Ours must come as close to the exact result as PyTorch's
// own fp32 cross-entropy does, within a factor of two.
TEST(FusedLmLoss, EqualsCrossEntropyOfTheLogitsWithIgnoredRows) {
  const auto c = head_case(torch::kFloat);
  const auto exact = reference({c.hidden.to(torch::kDouble), c.weight.to(torch::kDouble), c.targets});
  const auto torch_fp32 = reference(c);
  EXPECT_GT(exact.loss, 1.0) << "a loss that is not trivially small";
  const double hidden_error = max_gap(torch_fp32.grad_hidden, exact.grad_hidden);
  const double weight_error = max_gap(torch_fp32.grad_weight, exact.grad_weight);
  for (const auto& ours :
       {run_head(c, [](const HeadCase& m) { return nn::lm_loss(m.hidden, m.weight, m.targets); }),
        run_head(c, [](const HeadCase& m) { return nn::chunked_lm_loss(m.hidden, m.weight, m.targets, 5); })}) {
    EXPECT_NEAR(ours.loss, exact.loss, 1e-6 * exact.loss);
    EXPECT_EQ(ours.grad_hidden.scalar_type(), torch::kFloat);
    EXPECT_EQ(ours.grad_weight.scalar_type(), torch::kFloat);
    EXPECT_LE(max_gap(ours.grad_hidden, exact.grad_hidden), 2 * hidden_error)
        << "PyTorch's fp32 error: " << hidden_error;
    EXPECT_LE(max_gap(ours.grad_weight, exact.grad_weight), 2 * weight_error)
        << "PyTorch's fp32 error: " << weight_error;
  }
}

TEST(FusedLmLoss, Fp32ColumnBlocksWithARaggedEndAndAWhollyIgnoredBlock) {
  // fp32 logits go transposed through blocks of 64 columns (one per row of
  // hidden): 150 rows make two full blocks and a ragged one, and the whole
  // second block is ignored.
  torch::manual_seed(7);
  HeadCase c;
  c.hidden = (torch::randn({150, 24}) * 3).requires_grad_();
  c.weight = (torch::randn({1000, 24}) * torch::rand({1000, 1}) * 2).requires_grad_();
  c.targets = torch::randint(0, 1000, {150}, torch::kLong);
  c.targets.narrow(0, 64, 64).fill_(-100);
  const auto exact = reference({c.hidden.to(torch::kDouble), c.weight.to(torch::kDouble), c.targets});
  const auto torch_fp32 = reference(c);
  const auto ours = run_head(c, [](const HeadCase& m) { return nn::lm_loss(m.hidden, m.weight, m.targets); });
  EXPECT_NEAR(ours.loss, exact.loss, 1e-6 * exact.loss);
  EXPECT_LE(max_gap(ours.grad_hidden, exact.grad_hidden), 2 * max_gap(torch_fp32.grad_hidden, exact.grad_hidden));
  EXPECT_LE(max_gap(ours.grad_weight, exact.grad_weight), 2 * max_gap(torch_fp32.grad_weight, exact.grad_weight));
  EXPECT_TRUE(ours.grad_hidden.narrow(0, 64, 64).eq(0).all().item<bool>()) << "ignored rows get no gradient";
}

TEST(FusedLmLoss, InBf16TheGradientsKeepTheirDtypeAndAgreeToBf16Precision) {
  const auto c = head_case(torch::kBFloat16);
  const auto expected = reference(c);
  expect_close(run_head(c, [](const HeadCase& m) { return nn::lm_loss(m.hidden, m.weight, m.targets); }), expected,
               1e-2, 1e-4);
  expect_close(run_head(c, [](const HeadCase& m) { return nn::chunked_lm_loss(m.hidden, m.weight, m.targets, 5); }),
               expected, 1e-2, 1e-4);
}

TEST(FusedLmLoss, ATargetOutsideTheVocabularyIsNamed) {
  auto c = head_case(torch::kFloat);
  c.targets[7] = 1000;
  try {
    nn::lm_loss(c.hidden, c.weight, c.targets);
    FAIL() << "accepted target 1000 of a 1000-token vocabulary";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 1000 at row 7 is outside the vocabulary [0, 1000)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fsdp::models::loss_equivalence_test
