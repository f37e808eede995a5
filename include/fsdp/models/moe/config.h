#pragma once
// The Mixture-of-Experts options every MoE family shares (Qwen3-MoE's
// sparse blocks, Llama 4's routed experts): how many experts, how many per
// token, their width, which layers have them and the load-balancing loss.
// No LibTorch: the planner and the config adapters read it too.

#include <cstdint>
#include <vector>

namespace fsdp::models {

// num_experts == 0 means a dense model.
struct MoEConfig {
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;  // each routed expert's SwiGLU width
  bool norm_topk_prob = true;         // Qwen3-MoE: top-k probabilities renormalised to sum to 1
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  double router_aux_loss_coef = 0.0;  // 0: no load-balancing loss
  // Qwen3-MoE's output_router_logits: transformers adds the load-balancing
  // loss to the training loss only when config.json sets it (its default is
  // false); the presets here train with it.
  bool output_router_logits = true;

  // Hugging Face's rule (Qwen3-MoE's, and Llama 4's moe_layers written as
  // its complement): sparse unless listed in mlp_only_layers, every
  // decoder_sparse_step-th layer.
  bool is_sparse(int64_t layer) const;
  // The sparse layers among the first `layers`, in order.
  std::vector<int64_t> sparse_layers(int64_t layers) const;
  // Every layer sparse except those not in `sparse`: how a list of MoE
  // layers (Llama 4's moe_layers) is held.
  void set_sparse_layers(const std::vector<int64_t>& sparse, int64_t layers);
};

}  // namespace fsdp::models
