#include "fsdp/models/llama/tensor_parallel.h"

#include "fsdp/common/error.h"
#include "fsdp/models/moe/moe.h"
#include "fsdp/tensor_parallel/linear_styles.h"

namespace fsdp::models {

void tensor_parallelize_llama(LlamaForCausalLMImpl& model, const std::shared_ptr<dist::ProcessGroup>& group) {
  const int64_t ranks = group->size();
  using tp::LinearStyle;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    FSDP_CHECK(dynamic_cast<SparseMoeBlockImpl*>(item.value().get()) == nullptr, "tensor parallelism: '", name,
               "' is a Mixture-of-Experts layer, whose experts are not cut across ranks yet");
    if (auto* attention = dynamic_cast<LlamaAttentionImpl*>(item.value().get())) {
      // Whole heads on each rank, and as many key/value heads per query
      // head as the model has (grouped-query attention stays grouped).
      FSDP_CHECK(attention->n_heads % ranks == 0 && attention->n_kv_heads % ranks == 0, "tensor parallelism over ",
                 ranks, " ranks: '", name, "' has ", attention->n_heads, " query heads and ", attention->n_kv_heads,
                 " key/value heads, and each must divide by ", ranks, " (fewer key/value heads than ranks are ",
                 "not replicated: choose a degree that divides ", attention->n_kv_heads, ")");
      tp::parallelize_linear(*attention->q_proj, LinearStyle::kColumnwise, group);
      tp::parallelize_linear(*attention->k_proj, LinearStyle::kColumnwise, group);
      tp::parallelize_linear(*attention->v_proj, LinearStyle::kColumnwise, group);
      tp::parallelize_linear(*attention->o_proj, LinearStyle::kRowwise, group);
      attention->n_heads /= ranks;
      attention->n_kv_heads /= ranks;
    } else if (auto* mlp = dynamic_cast<nn::SwiGLUImpl*>(item.value().get())) {
      tp::parallelize_linear(*mlp->gate_proj, LinearStyle::kColumnwise, group);
      tp::parallelize_linear(*mlp->up_proj, LinearStyle::kColumnwise, group);
      tp::parallelize_linear(*mlp->down_proj, LinearStyle::kRowwise, group);
    }
  }
}

}  // namespace fsdp::models
