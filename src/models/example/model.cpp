#include "fsdp/models/example/model.h"

#include "fsdp/core/fully_shard.h"
#include "fsdp/common/error.h"
#include "fsdp/models/attention.h"
#include "fsdp/models/family.h"
#include "fsdp/nn/dropout.h"

namespace fsdp::models {

namespace F = torch::nn::functional;

ExampleBlockImpl::ExampleBlockImpl(const ExampleTransformerConfig& c) : n_heads(c.n_heads) {
  TORCH_CHECK(c.dim % c.n_heads == 0, "dim ", c.dim, " is not a multiple of n_heads ", c.n_heads);
  const auto no_bias = [&](int64_t in, int64_t out) { return torch::nn::LinearOptions(in, out).bias(false); };
  attention_norm = register_module("attention_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
  wq = register_module("wq", torch::nn::Linear(no_bias(c.dim, c.dim)));
  wk = register_module("wk", torch::nn::Linear(no_bias(c.dim, c.dim)));
  wv = register_module("wv", torch::nn::Linear(no_bias(c.dim, c.dim)));
  wo = register_module("wo", torch::nn::Linear(no_bias(c.dim, c.dim)));
  ffn_norm = register_module("ffn_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
  w1 = register_module("w1", torch::nn::Linear(c.dim, 4 * c.dim));
  w2 = register_module("w2", torch::nn::Linear(4 * c.dim, c.dim));
  resid_dropout = register_module("resid_dropout", torch::nn::Dropout(c.dropout));
}

torch::Tensor ExampleBlockImpl::forward(torch::Tensor x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hs = C / n_heads;
  auto h = attention_norm(x);
  const auto heads = [&](const torch::Tensor& t) { return t.view({B, T, n_heads, hs}); };
  auto y = causal_attention(heads(wq(h)), heads(wk(h)), heads(wv(h)));  // (B, T, C)
  x = x + nn::dropout(resid_dropout, wo(y));
  return x + nn::dropout(resid_dropout, w2(F::gelu(w1(ffn_norm(x)))));
}

ExampleTransformerImpl::ExampleTransformerImpl(const ExampleTransformerConfig& c) : max_seq_len(c.max_seq_len) {
  tok_embeddings = register_module("tok_embeddings", torch::nn::Embedding(c.vocab_size, c.dim));
  pos_embeddings = register_module("pos_embeddings", torch::nn::Embedding(c.max_seq_len, c.dim));
  dropout = register_module("dropout", torch::nn::Dropout(c.dropout));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.n_layers; ++i) {
    blocks.emplace_back(c);
    layers->push_back(blocks.back());
  }
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
  output = register_module("output", torch::nn::Linear(torch::nn::LinearOptions(c.dim, c.vocab_size).bias(false)));
}

torch::Tensor ExampleTransformerImpl::hidden(torch::Tensor tokens) {
  TORCH_CHECK(tokens.size(1) <= max_seq_len, "sequence length ", tokens.size(1), " exceeds the model's ", max_seq_len,
              " positions");
  auto positions = torch::arange(tokens.size(1), torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
  auto x = nn::dropout(dropout, tok_embeddings(tokens) + pos_embeddings(positions));
  for (auto& block : blocks) x = block(x);
  return norm(x);
}

torch::Tensor ExampleTransformerImpl::forward(torch::Tensor tokens) { return output(hidden(tokens)); }

namespace {
// The example transformer behind the CausalLM interface: its output head is
// untied (output.weight), and its final norm is applied in forward.
struct ExampleLMImpl : CausalLMImpl {
  explicit ExampleLMImpl(const ExampleTransformerConfig& c) : config(c) {
    model = register_module("model", ExampleTransformer(c));
  }
  torch::Tensor forward(torch::Tensor tokens) override { return model->hidden(tokens); }
  torch::Tensor output_weight() override { return model->output->weight; }
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (auto& b : model->blocks) out.push_back(b.ptr());
    return out;
  }
  void set_activation_checkpointing(bool enabled) override {
    FSDP_CHECK(!enabled, "the example transformer does not support activation checkpointing");
  }
  std::string family() const override { return "example"; }
  int64_t vocab_size() const override { return config.vocab_size; }
  int64_t max_seq_len() const override { return config.max_seq_len; }
  int64_t dim() const override { return config.dim; }
  int64_t n_layers() const override { return config.n_layers; }
  ExampleTransformerConfig config;
  ExampleTransformer model{nullptr};
};
}  // namespace

FamilySpec example_family() {
  FamilySpec f;
  f.name = "example";
  f.presets = {"example"};
  f.build_preset = [](const std::string&, double dropout) -> CausalLM {
    ExampleTransformerConfig c;
    c.dropout = dropout;
    return std::make_shared<ExampleLMImpl>(c);
  };
  f.preset_vocab_size = [](const std::string&) { return ExampleTransformerConfig{}.vocab_size; };
  f.preset_parameter_count = [](const std::string&) {
    const ExampleTransformerConfig c;
    const int64_t C = c.dim, block = 2 * 2 * C + 4 * C * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
    return 2 * c.vocab_size * C + c.max_seq_len * C + c.n_layers * block + 2 * C;
  };
  f.to_hf = [](const CausalLMImpl&) -> nlohmann::json {
    throw Error("the example transformer has no Hugging Face equivalent to export to");
  };
  return f;
}

}  // namespace fsdp::models
