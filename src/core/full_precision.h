#pragma once
// Which parameters a mixed-precision policy leaves in their own dtype.

#include <unordered_set>

#include "fsdp/core/options.h"

namespace fsdp {

// The parameters owned directly by the modules under `root` (itself
// included) that the policy's keep_full_precision names, by TensorImpl.
// Empty when the policy changes no dtype: then nothing needs keeping.
std::unordered_set<const void*> full_precision_parameters(const torch::nn::Module& root,
                                                          const MixedPrecisionPolicy& policy);

}  // namespace fsdp
