// Model shapes, parameter counts against published figures, and Hugging
// Face parameter names.

#include <gtest/gtest.h>

#include "fsdp/common/error.h"
#include "fsdp/models/gpt2/model.h"
#include "fsdp/models/llama/model.h"
#include "fsdp/models/registry.h"

namespace fsdp::models::models_test {
namespace {

std::set<std::string> names(torch::nn::Module& m) {
  std::set<std::string> out;
  for (const auto& item : m.named_parameters()) out.insert(item.key());
  return out;
}

TEST(GPT2, ParameterCountMatchesThePublishedFigure) {
  auto model = build_preset("gpt2");
  EXPECT_EQ(count_parameters(*model), 124439808);  // GPT-2 small with its tied head
}

TEST(GPT2, HuggingFaceNamesAndConv1DLayout) {
  auto model = build_preset("gpt2-tiny");
  const std::set<std::string> expected_block = {
      "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
      "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
      "mlp.c_proj.weight", "mlp.c_proj.bias"};
  std::set<std::string> expected = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                                    "transformer.ln_f.bias"};
  for (int i = 0; i < 2; ++i) {
    for (const auto& n : expected_block) expected.insert("transformer.h." + std::to_string(i) + "." + n);
  }
  EXPECT_EQ(names(*model), expected);
  // Conv1D is stored [in, out], as Hugging Face stores it.
  auto& gpt2 = static_cast<GPT2LMHeadModelImpl&>(*model);
  EXPECT_EQ(gpt2.transformer->blocks[0]->attn->c_attn->weight.sizes(), (std::vector<int64_t>{32, 96}));
  EXPECT_EQ(gpt2.transformer->blocks[0]->mlp->c_proj->weight.sizes(), (std::vector<int64_t>{128, 32}));
  EXPECT_TRUE(model->output_weight().is_same(gpt2.transformer->wte->weight)) << "the head is tied";
}

TEST(GPT2, ForwardShapeAndPositionLimit) {
  auto model = build_preset("gpt2-tiny");
  auto tokens = torch::randint(0, 512, {3, 10}, torch::kLong);
  EXPECT_EQ(model->forward(tokens).sizes(), (std::vector<int64_t>{3, 10, 32}));
  try {
    model->forward(torch::zeros({1, 65}, torch::kLong));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence length 65 exceeds the model's 64 positions"), std::string::npos);
  }
}

TEST(Llama, ParameterCountsMatchPublishedFiguresAndTheModules) {
  // Meta's Llama 3 8B: 8,030,261,248 parameters (untied head).
  EXPECT_EQ(llama_parameter_count(llama_preset("llama3-8b")), 8030261248LL);
  auto tiny = build_preset("llama-tiny");
  EXPECT_EQ(count_parameters(*tiny), llama_parameter_count(llama_preset("llama-tiny")));
}

TEST(Llama, HuggingFaceNames) {
  auto model = build_preset("llama-tiny");
  const auto n = names(*model);
  for (const char* key : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                          "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
                          "model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.gate_proj.weight",
                          "model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight",
                          "model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
                          "model.norm.weight", "lm_head.weight"}) {
    EXPECT_EQ(n.count(key), 1u) << key;
  }
  EXPECT_EQ(n.size(), 2u + 2 * 9 + 1) << "embed, head, norm and 9 tensors per layer";
  auto& llama = static_cast<LlamaForCausalLMImpl&>(*model);
  // Grouped-query attention: 4 query heads share 2 key/value heads of 16.
  const auto attention = std::dynamic_pointer_cast<LlamaAttentionImpl>(llama.model->layer(0).self_attn);
  EXPECT_EQ(attention->k_proj->weight.sizes(), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(model->forward(torch::zeros({2, 5}, torch::kLong)).sizes(), (std::vector<int64_t>{2, 5, 64}));
}

TEST(Llama, RotaryUsesTheRotateHalfConvention) {
  // Head size 4: frequencies theta^0 and theta^(-1/2); position 1 rotates
  // the pair (x0, x2) by angle 1 and (x1, x3) by 1 / sqrt(theta).
  const double theta = 10000.0;
  auto [cos, sin] = rotary_tables(2, 4, theta);
  auto x = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 1, 1, 4}).expand({1, 1, 2, 4}).contiguous();
  auto y = apply_rotary(x, cos, sin)[0][0][1];
  const double a = 1.0, b = 1.0 / std::sqrt(theta);
  const std::vector<double> expected = {1 * std::cos(a) - 3 * std::sin(a), 2 * std::cos(b) - 4 * std::sin(b),
                                        3 * std::cos(a) + 1 * std::sin(a), 4 * std::cos(b) + 2 * std::sin(b)};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i].item<double>(), expected[static_cast<size_t>(i)], 1e-5) << i;
  // Position 0 is not rotated.
  EXPECT_TRUE(torch::allclose(apply_rotary(x, cos, sin)[0][0][0], x[0][0][0]));
}

TEST(ExampleTransformer, TheSeedTrainersModuleTree) {
  // The FSDP2 example's model: dim 16, 10 layers, vocab 1024, 64 positions.
  auto model = build_preset("example");
  const auto n = names(*model);
  for (const char* key : {"model.tok_embeddings.weight", "model.pos_embeddings.weight",
                          "model.layers.0.attention_norm.weight", "model.layers.0.wq.weight", "model.layers.0.wk.weight",
                          "model.layers.0.wv.weight", "model.layers.0.wo.weight", "model.layers.9.ffn_norm.bias",
                          "model.layers.9.w1.weight", "model.layers.9.w2.bias", "model.norm.weight",
                          "model.output.weight"}) {
    EXPECT_EQ(n.count(key), 1u) << key;
  }
  // 1024*16 + 64*16 + 10 * (2*32 + 4*256 + (16*64+64) + (64*16+16)) + 32 + 16*1024
  EXPECT_EQ(count_parameters(*model), 16384 + 1024 + 10 * (64 + 1024 + 1088 + 1040) + 32 + 16384);
  EXPECT_EQ(model->forward(torch::zeros({2, 64}, torch::kLong)).sizes(), (std::vector<int64_t>{2, 64, 16}));
}

TEST(Registry, UnknownPresetSuggestsTheClosest) {
  try {
    build_preset("gpt2-tinny");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'gpt2-tiny'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fsdp::models::models_test
