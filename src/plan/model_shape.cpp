#include "fsdp/plan/model_shape.h"

#include "fsdp/common/error.h"
#include "fsdp/models/gpt2/model.h"
#include "fsdp/models/llama/model.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/layers.h"

namespace fsdp::plan {

ModelShape model_shape(const train::TrainConfig::Model& config) {
  models::CausalLM model;
  {
    nn::DeferredInit deferred;  // shapes only: no parameter gets memory
    model = config.init_from.empty() ? models::build_preset(config.name, 0.0, config.vocab_size)
                                     : models::build_from_hf_dir(config.init_from, /*deferred=*/true);
  }
  const std::string what = config.init_from.empty() ? "--model " + config.name : "--init-from " + config.init_from;
  ModelShape s;
  s.family = model->family();
  s.layers = model->n_layers();
  s.hidden = model->dim();
  s.vocab = model->vocab_size();
  s.max_seq_len = model->max_seq_len();
  if (const auto* gpt2 = dynamic_cast<const models::GPT2LMHeadModelImpl*>(model.get())) {
    s.heads = s.kv_heads = gpt2->config.n_head;
    s.head_dim = gpt2->config.n_embd / gpt2->config.n_head;
    s.ffn = 4 * gpt2->config.n_embd;
    s.layer_norm = true;
  } else if (const auto* llama = dynamic_cast<const models::LlamaForCausalLMImpl*>(model.get());
             llama != nullptr && llama->config.moe.num_experts == 0) {
    const auto& c = llama->config;
    s.heads = c.num_attention_heads;
    s.kv_heads = c.num_key_value_heads;
    s.head_dim = c.head_size();
    s.ffn = c.intermediate_size;
    s.qk_norm = c.qk_norm;
  } else {
    throw Error(what + ": fsdp plan has activation formulas for GPT-2, Llama and Qwen3 (dense) models; this is a " +
                s.family + " model");
  }
  const auto blocks = model->blocks();
  FSDP_CHECK(!blocks.empty(), what, ": the model has no blocks");
  s.block_params = models::count_parameters(*blocks.front());
  for (const auto& b : blocks) {
    FSDP_CHECK(models::count_parameters(*b) == s.block_params, what, ": its blocks differ in size");
  }
  s.root_params = models::count_parameters(*model) - s.layers * s.block_params;
  return s;
}

}  // namespace fsdp::plan
