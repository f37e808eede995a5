#include "core/full_precision.h"

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/module.h>

namespace fsdp {

// [Note: modules kept in full precision]
// BatchNorm's statistics are buffers the policy does not cast, and its
// running variance accumulated in bf16 loses the small updates a long run
// is made of; FSDP1 (MixedPrecision's _module_classes_to_ignore) and DDP
// keep it out of mixed precision for that reason. Here a kept module's
// parameters stay in their own dtype through the gather, the forward and
// the reduction: fully_shard gives them a flat shard of their own within
// the unit ([Note: a unit of several dtypes]) whose param and reduce dtype
// are the master's, and replicate leaves them out of the cast and buckets
// them by their own dtype. The module still receives the policy's compute
// dtype as input (its input is the layer before it's output, not a unit's
// forward argument), so it runs in mixed types, which PyTorch's batch_norm
// kernels take on CPU and GPU (a bf16 input with fp32 weight and
// statistics) and return in the input's dtype: the layers after it see the
// compute dtype as before. FSDP1 instead wraps each such module as a unit
// of its own with mixed precision off; LibTorch modules have no hooks for
// a module called inside its parent's forward, so a unit there would
// never gather.
bool is_batch_norm(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module) != nullptr;
}

std::unordered_set<const void*> full_precision_parameters(const torch::nn::Module& root,
                                                          const MixedPrecisionPolicy& policy) {
  std::unordered_set<const void*> kept;
  if (!policy.keep_full_precision || (!policy.param_dtype && !policy.reduce_dtype)) return kept;
  const auto keep = [&](const torch::nn::Module& module) {
    if (!policy.keep_full_precision(module)) return;
    for (const auto& p : module.parameters(/*recurse=*/false)) kept.insert(p.unsafeGetTensorImpl());
  };
  keep(root);
  for (const auto& child : root.modules(/*include_self=*/false)) keep(*child);
  return kept;
}

}  // namespace fsdp
