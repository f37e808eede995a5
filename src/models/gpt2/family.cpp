// GPT-2: its presets and its Hugging Face adapter (GPT2LMHeadModel).

#include <nlohmann/json.hpp>

#include "fsdp/models/family.h"
#include "fsdp/models/gpt2/config.h"
#include "fsdp/models/gpt2/model.h"
#include "fsdp/models/shape.h"

namespace fsdp::models {

namespace {
ModelShape gpt2_shape(const GPT2Config& c) {
  ModelShape s;
  s.family = "gpt2";
  s.layers = c.n_layer;
  s.hidden = c.n_embd;
  s.heads = s.kv_heads = c.n_head;
  s.head_dim = c.n_embd / c.n_head;
  s.ffn = 4 * c.n_embd;
  s.vocab = c.vocab_size;
  s.max_seq_len = c.n_positions;
  s.layer_norm = true;
  s.tied_head = true;
  const int64_t C = s.hidden;
  s.projections = {{"qkv", C, 3 * C, true}, {"attention out", C, C, true}, {"mlp up", C, s.ffn, true},
                   {"mlp down", s.ffn, C, true}};
  s.block_memory = [heads = s.heads, C, ffn = s.ffn](int64_t /*layer*/, const ActivationSizes& sz) {
    const int64_t N = sz.N, cb = sz.compute, attention = attention_kept(heads, sz);
    BlockMemory m;
    // input, ln_1, c_attn's qkv (3C), attention output, residual h, ln_2,
    // c_fc's output (4C) and GELU's (4C): 15 C-wide rows and the input.
    m.kept = N * C * cb + 2 * layer_norm_saved(N, C, sz) + N * (3 * C + C + C + 2 * ffn) * cb + attention;
    // Selective checkpointing: the input, qkv and c_fc's outputs, the
    // attention's output with its statistic.
    m.selective = N * C * cb + N * (3 * C + ffn + C) * cb + attention;
    m.backward_transient = (2 * N * ffn + 2 * N * C) * cb;
    return m;
  };
  return s;
}
}  // namespace

FamilySpec gpt2_family() {
  FamilySpec f;
  f.name = "gpt2";
  f.presets = gpt2_preset_names();
  f.build_preset = [](const std::string& name, double dropout) -> CausalLM {
    auto c = gpt2_preset(name);
    c.embd_pdrop = c.attn_pdrop = c.resid_pdrop = dropout;
    return std::make_shared<GPT2LMHeadModelImpl>(c);
  };
  f.preset_vocab_size = [](const std::string& name) { return gpt2_preset(name).vocab_size; };
  f.preset_parameter_count = [](const std::string& name) { return gpt2_parameter_count(gpt2_preset(name)); };
  f.from_hf = [](const nlohmann::json& j, const std::string& where) -> CausalLM {
    return std::make_shared<GPT2LMHeadModelImpl>(gpt2_config_from_hf(j, where));
  };
  f.to_hf = [](const CausalLMImpl& m) {
    return gpt2_config_to_hf(dynamic_cast<const GPT2LMHeadModelImpl&>(m).config);
  };
  // The original gpt2 weights were saved from GPT2Model: no "transformer."
  // prefix, and the causal-mask buffers (attn.bias, attn.masked_bias).
  f.hf_keys = [](const std::string& fqn) {
    std::vector<std::string> keys = {fqn};
    const std::string prefix = "transformer.";
    if (fqn.rfind(prefix, 0) == 0) keys.push_back(fqn.substr(prefix.size()));
    return keys;
  };
  f.ignored_hf_tensor = [](const std::string& key) {
    const auto ends_with = [&](const std::string& s) {
      return key.size() >= s.size() && key.compare(key.size() - s.size(), s.size(), s) == 0;
    };
    return ends_with("attn.bias") || ends_with("attn.masked_bias") || key == "lm_head.weight";
  };
  f.shape = [](const CausalLMImpl& m) { return gpt2_shape(dynamic_cast<const GPT2LMHeadModelImpl&>(m).config); };
  return f;
}

}  // namespace fsdp::models
