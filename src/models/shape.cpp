#include "fsdp/models/shape.h"

namespace fsdp::models {

int64_t attention_kept(int64_t heads, const ActivationSizes& s) {
  // The CPU kernel recomputes its weights in backward from q and k, which
  // the families count already (models/attention.h).
  return s.flash ? s.B * heads * s.T * 4 : 0;
}

int64_t rms_norm_saved(int64_t rows, int64_t width, const ActivationSizes& s) {
  const int64_t elems = rows * width, per_row = rows * 4;
  if (s.compute == 4) return elems * (4 + 4) + per_row;
  return elems * (4 + 2 + 2) + per_row;
}

int64_t layer_norm_saved(int64_t rows, int64_t width, const ActivationSizes& s) {
  const int64_t stats = 2 * rows * 4;
  return rows * width * s.compute + stats + (s.compute == 4 ? 0 : width * 4);
}

}  // namespace fsdp::models
