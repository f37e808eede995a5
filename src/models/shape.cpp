#include "fsdp/models/shape.h"

namespace fsdp::models {

int64_t attention_kept(int64_t heads, const ActivationSizes& s) {
  // The CPU kernel recomputes its weights in backward from q and k, which
  // the families count already (models/attention.h).
  return s.flash ? s.B * heads * s.T * 4 : 0;
}

int64_t rms_norm_saved(int64_t rows, int64_t width, const ActivationSizes& s) {
  return rows * width * s.compute + rows * 4 + (s.compute == 4 ? 0 : width * 4);
}

int64_t swiglu_kept(int64_t rows, int64_t ffn, const ActivationSizes& s) {
  return (s.composite_swiglu ? 4 : 3) * rows * ffn * s.compute;
}

int64_t layer_norm_saved(int64_t rows, int64_t width, const ActivationSizes& s) {
  const int64_t stats = 2 * rows * 4;
  return rows * width * s.compute + stats + (s.compute == 4 ? 0 : width * 4);
}

}  // namespace fsdp::models
