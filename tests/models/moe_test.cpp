// Qwen3-MoE's sparse block against a naive computation written here (each
// token through its top-k experts, one token at a time), and the
// load-balancing loss against Hugging Face's definition written out
// literally and against a hand computation.

#include <gtest/gtest.h>

#include "fsdp/models/llama/model.h"
#include "fsdp/models/llama4/model.h"
#include "fsdp/models/moe/moe.h"
#include "fsdp/models/registry.h"

namespace fsdp::models::moe_test {
namespace {

MoEConfig tiny_moe(bool norm_topk) {
  MoEConfig c;
  c.num_experts = 6;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 8;
  c.norm_topk_prob = norm_topk;
  return c;
}

// One token at a time: softmax over experts, the k largest by a scan,
// renormalised if asked, each chosen expert applied to this token alone.
torch::Tensor naive_moe(SparseMoeBlockImpl& block, const torch::Tensor& x) {
  const auto tokens = x.reshape({-1, x.size(-1)});
  std::vector<torch::Tensor> rows;
  for (int64_t n = 0; n < tokens.size(0); ++n) {
    const auto token = tokens[n].unsqueeze(0);
    const auto probs = torch::softmax(torch::matmul(token, block.gate->weight.t()), -1)[0];
    std::vector<int64_t> order(static_cast<size_t>(block.num_experts));
    for (size_t e = 0; e < order.size(); ++e) order[e] = static_cast<int64_t>(e);
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return probs[a].item<float>() > probs[b].item<float>(); });
    auto total = torch::zeros({});
    for (int64_t j = 0; j < block.top_k; ++j) total = total + probs[order[static_cast<size_t>(j)]];
    auto out = torch::zeros_like(token);
    for (int64_t j = 0; j < block.top_k; ++j) {
      const int64_t e = order[static_cast<size_t>(j)];
      auto w = probs[e];
      if (block.norm_topk_prob) w = w / total;
      auto& expert = block.expert(e);
      const auto h = torch::silu(torch::matmul(token, expert.gate_proj->weight.t())) *
                     torch::matmul(token, expert.up_proj->weight.t());
      out = out + w * torch::matmul(h, expert.down_proj->weight.t());
    }
    rows.push_back(out);
  }
  return torch::cat(rows).view(x.sizes());
}

class Dispatch : public ::testing::TestWithParam<bool> {};

TEST_P(Dispatch, EqualsEachTokenThroughItsTopKExpertsByLoop) {
  torch::manual_seed(11);
  SparseMoeBlock block(16, tiny_moe(GetParam()));
  auto x = torch::randn({3, 5, 16});
  auto [fast, stats] = block(x);
  const auto slow = naive_moe(*block, x);
  EXPECT_TRUE(torch::allclose(fast, slow, 1e-5, 1e-6)) << (fast - slow).abs().max().item<float>();
  // Router statistics: probability mass and slot counts per expert.
  const auto probs = torch::softmax(torch::matmul(x.reshape({15, 16}), block->gate->weight.t()), -1);
  EXPECT_TRUE(torch::allclose(stats[0], probs.sum(0), 1e-5));
  EXPECT_EQ(stats[1].sum().item<double>(), 15 * 2);
  // Gradients agree too.
  auto xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
  std::get<0>(block(xa)).pow(2).sum().backward();
  const auto fast_gate = block->gate->weight.grad().clone();
  block->zero_grad();
  naive_moe(*block, xb).pow(2).sum().backward();
  EXPECT_TRUE(torch::allclose(xa.grad(), xb.grad(), 1e-4, 1e-6));
  EXPECT_TRUE(torch::allclose(fast_gate, block->gate->weight.grad(), 1e-4, 1e-6));
}

INSTANTIATE_TEST_SUITE_P(NormTopK, Dispatch, ::testing::Bool());

TEST(Dispatch, AnExpertWithNoTokensGetsAZeroGradient) {
  // A router that sends every token to experts 0 and 1: the others compute
  // no rows, yet their weights get a gradient, zero, as transformers' fused
  // expert tensor gives them, so AdamW treats them alike at every world
  // size (tests/reference/fsdp2_alignment_test.py found W = 1 skipping them).
  torch::manual_seed(12);
  SparseMoeBlock block(16, tiny_moe(true));
  {
    torch::NoGradGuard no_grad;
    block->gate->weight.zero_();
    block->gate->weight[0].fill_(1.0);
    block->gate->weight[1].fill_(0.5);
  }
  auto x = torch::rand({2, 4, 16}) + 0.1;  // positive: experts 0 and 1 lead
  auto [y, stats] = block(x);
  y.sum().backward();
  EXPECT_EQ(stats[1][0].item<double>(), 8);
  EXPECT_EQ(stats[1][1].item<double>(), 8);
  for (int e = 2; e < 6; ++e) {
    const auto& g = block->expert(e).up_proj->weight.grad();
    ASSERT_TRUE(g.defined()) << e;
    EXPECT_EQ(g.abs().max().item<float>(), 0.0f) << e;
  }
  EXPECT_GT(block->expert(0).up_proj->weight.grad().abs().max().item<float>(), 0.0f);
}

TEST(LoadBalancingLoss, HandComputed) {
  // Two experts, top-1, two layers of two tokens. Layer A: probabilities
  // (0.7, 0.3) and (0.4, 0.6): one slot each. Layer B: (0.9, 0.1) and
  // (0.8, 0.2): both to expert 0. Over the 4 tokens: slot fractions
  // (3/4, 1/4), mean probabilities (2.8/4, 1.2/4) = (0.7, 0.3).
  // Loss = 2 * (0.75 * 0.7 + 0.25 * 0.3) = 1.2.
  const auto a = torch::tensor({1.1f, 0.9f, 1.0f, 1.0f}).view({2, 2});
  const auto b = torch::tensor({1.7f, 0.3f, 2.0f, 0.0f}).view({2, 2});
  EXPECT_NEAR(load_balancing_loss({a, b}, 2).item<double>(), 1.2, 1e-6);
}

// Hugging Face's load_balancing_loss_func, literally: concatenate every
// layer's router logits, softmax, top-k, one-hot, means over tokens.
torch::Tensor reference_aux_loss(const std::vector<torch::Tensor>& logits, int64_t top_k) {
  const auto all = torch::cat(logits, 0);
  const int64_t E = all.size(1);
  const auto weights = torch::softmax(all, -1);
  const auto selected = std::get<1>(torch::topk(weights, top_k, -1));
  const auto mask = torch::one_hot(selected, E).to(torch::kFloat);  // (N, k, E)
  const auto tokens_per_expert = mask.mean(0);                       // (k, E)
  const auto prob_per_expert = weights.mean(0);                      // (E)
  return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * static_cast<double>(E);
}

TEST(LoadBalancingLoss, EqualsHuggingFacesDefinitionWithItsGradient) {
  torch::manual_seed(13);
  SparseMoeBlock first(16, tiny_moe(true)), second(16, tiny_moe(true));
  auto x1 = torch::randn({2, 7, 16}), x2 = torch::randn({2, 7, 16});
  auto s1 = std::get<1>(first(x1)), s2 = std::get<1>(second(x2));
  auto ours = load_balancing_loss({s1, s2}, 14);
  auto theirs = reference_aux_loss({first->gate(x1.view({14, 16})), second->gate(x2.view({14, 16}))}, 2);
  EXPECT_NEAR(ours.item<double>(), theirs.item<double>(), 1e-6);
  ours.backward();
  const auto g1 = first->gate->weight.grad().clone(), g2 = second->gate->weight.grad().clone();
  first->zero_grad();
  second->zero_grad();
  theirs.backward();
  EXPECT_TRUE(torch::allclose(g1, first->gate->weight.grad(), 1e-5, 1e-7));
  EXPECT_TRUE(torch::allclose(g2, second->gate->weight.grad(), 1e-5, 1e-7));
}

TEST(Qwen3MoeModel, AuxiliaryLossIsTheScaledLossOverTheSparseLayers) {
  torch::manual_seed(14);
  auto model = build_preset("qwen3-moe-tiny");
  auto tokens = torch::randint(0, 512, {2, 16}, torch::kLong);
  model->forward(tokens);
  const auto aux = model->auxiliary_loss();
  ASSERT_TRUE(aux.defined());
  // Recompute the sparse layers' router logits from their inputs, by hand.
  auto& m = dynamic_cast<LlamaForCausalLMImpl&>(*model);
  torch::NoGradGuard no_grad;
  auto [cos, sin] = rotary_tables(16, m.config.head_size(), m.config.rope_theta);
  auto x = m.model->embed_tokens(tokens);
  std::vector<torch::Tensor> logits;
  for (size_t i = 0; i < m.model->size(); ++i) {
    auto& block = m.model->layer(i);
    auto h = x + block.self_attn->forward(block.input_layernorm(x), cos, sin);
    if (auto moe = std::dynamic_pointer_cast<SparseMoeBlockImpl>(block.routed)) {
      logits.push_back(moe->gate(block.post_attention_layernorm(h)).view({32, 8}));
    }
    x = std::get<0>(block.forward(x, cos, sin));
  }
  ASSERT_EQ(logits.size(), 2u);
  EXPECT_NEAR(aux.item<double>(), 0.01 * reference_aux_loss(logits, 2).item<double>(), 1e-7);
  // No loss without gradients (evaluation).
  model->forward(tokens);
  EXPECT_FALSE(model->auxiliary_loss().defined());
}

// Hugging Face's Llama4TextMoe, literally: every expert computes every
// token, its input multiplied by the sigmoid of the token's router logit
// for that expert if among the top k, else by sigmoid(-inf) = 0; the
// shared expert is added.
torch::Tensor reference_llama4_moe(Llama4MoeImpl& block, const torch::Tensor& x) {
  const auto tokens = x.reshape({-1, x.size(-1)});
  const auto logits = torch::matmul(tokens, block.router->weight.t());
  const auto [top, chosen] = torch::topk(logits, block.top_k, 1);
  const auto scores = torch::sigmoid(torch::full_like(logits, -INFINITY).scatter(1, chosen, top));  // (N, E)
  auto out = block.shared_expert(tokens);
  for (int64_t e = 0; e < logits.size(1); ++e) {
    const auto in = tokens * scores.select(1, e).unsqueeze(1);
    const auto gate_up = torch::matmul(in, block.experts->gate_up_proj[e]);
    const int64_t width = gate_up.size(1) / 2;
    out = out + torch::matmul(gate_up.narrow(1, width, width) * torch::silu(gate_up.narrow(1, 0, width)),
                              block.experts->down_proj[e]);
  }
  return out.view(x.sizes());
}

TEST(Llama4Moe, DispatchEqualsEveryExpertOnEveryTokenWithItsGradients) {
  torch::manual_seed(15);
  auto c = llama4_preset("llama4-tiny");  // 4 experts of width 32, top 2, hidden 64
  Llama4Moe block(c);
  auto xa = torch::randn({3, 5, 64}).requires_grad_(true);
  auto xb = xa.detach().clone().requires_grad_(true);
  auto [fast, stats] = block(xa);
  const auto slow = reference_llama4_moe(*block, xb);
  EXPECT_TRUE(torch::allclose(fast, slow, 1e-5, 1e-6)) << (fast - slow).abs().max().item<float>();
  EXPECT_EQ(stats[1].sum().item<double>(), 15 * 2);
  fast.pow(2).sum().backward();
  std::vector<torch::Tensor> ours;
  for (const auto& p : block->parameters()) ours.push_back(p.grad().clone());
  block->zero_grad();
  slow.pow(2).sum().backward();
  const auto params = block->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(ours[i], params[i].grad(), 1e-4, 1e-6)) << i;
  }
  EXPECT_TRUE(torch::allclose(xa.grad(), xb.grad(), 1e-4, 1e-6));
}

TEST(Llama4Moe, AuxiliaryLossOnlyWhenTheConfigAsksForRouterLogits) {
  torch::manual_seed(16);
  auto c = llama4_preset("llama4-tiny");
  const auto tokens = torch::randint(0, 512, {2, 16}, torch::kLong);
  Llama4ForCausalLMImpl asks(c);
  asks.forward(tokens);
  ASSERT_TRUE(asks.auxiliary_loss().defined());
  // Its router logits, recomputed layer by layer: HF's definition, times the coefficient.
  std::vector<torch::Tensor> logits;
  {
    torch::NoGradGuard no_grad;
    const auto& t = c.text;
    const auto angles = torch::outer(torch::arange(16, torch::kFloat), rope_inv_freq(t.head_size(), t.rope_theta,
                                                                                     t.rope_scaling));
    auto x = asks.model->embed_tokens(tokens);
    for (size_t i = 0; i < asks.model->size(); ++i) {
      auto& block = asks.model->layer(i);
      auto h = x + block.self_attn->forward(block.input_layernorm(x), angles.cos(), angles.sin());
      if (auto moe = std::dynamic_pointer_cast<Llama4MoeImpl>(block.routed)) {
        logits.push_back(moe->router(block.post_attention_layernorm(h)).view({32, 4}));
      }
      x = std::get<0>(block.forward(x, angles.cos(), angles.sin()));
    }
  }
  ASSERT_EQ(logits.size(), 2u);
  EXPECT_NEAR(asks.auxiliary_loss().item<double>(), 0.01 * reference_aux_loss(logits, 2).item<double>(), 1e-7);
  c.output_router_logits = false;  // transformers' default: no load-balancing loss
  Llama4ForCausalLMImpl quiet(c);
  quiet.forward(tokens);
  EXPECT_FALSE(quiet.auxiliary_loss().defined());
}

}  // namespace
}  // namespace fsdp::models::moe_test
