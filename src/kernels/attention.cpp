// A block of attention weights (rows first..first+count of a causal
// square, each as wide as its last row) walked row by row: the causal
// softmax from each query's example start, its backward, and dropout.
#include <algorithm>

#include "kernels.h"

namespace fsdp::kernels {
namespace {

// Where query i's example starts (its weights before it are zero); 0 for
// every query where the rows are not packed.
inline int64_t attention_example_start(const int64_t* starts, int64_t i) { return starts != nullptr ? starts[i] : 0; }

}  // namespace

// These only walk a block's rows; the row kernels they call are the ones
// cloned per ISA level, so they are not.
void attention_softmax_block(float* block, int64_t first, int64_t count, const int64_t* starts, float scale) {
  const int64_t width = first + count;
  for (int64_t i = first; i < width; ++i) {
    const int64_t s = attention_example_start(starts, i);
    float* row = block + (i - first) * width;
    causal_softmax_row(row + s, i + 1 - s, width - s, scale);
    std::fill_n(row, s, 0.0f);
  }
}

void attention_softmax_block_bf16(uint16_t* block, float* scratch, int64_t first, int64_t count, const int64_t* starts,
                                  float scale) {
  const int64_t width = first + count;
  for (int64_t i = first; i < width; ++i) {
    const int64_t s = attention_example_start(starts, i);
    uint16_t* row = block + (i - first) * width;
    causal_softmax_row_bf16(row + s, scratch, i + 1 - s, width - s, scale);
    std::fill_n(row, s, uint16_t{0});
  }
}

void attention_softmax_backward_block(const float* p, float* dp, int64_t first, int64_t count, const int64_t* starts,
                                      float scale) {
  const int64_t width = first + count;
  for (int64_t i = first; i < width; ++i) {
    const int64_t s = attention_example_start(starts, i), row = (i - first) * width;
    causal_softmax_backward_row(p + row + s, dp + row + s, i + 1 - s, width - s, scale);
    std::fill_n(dp + row, s, 0.0f);
  }
}

void attention_softmax_backward_block_bf16(const uint16_t* p, uint16_t* dp, float* scratch, int64_t first,
                                           int64_t count, const int64_t* starts, float scale) {
  const int64_t width = first + count;
  for (int64_t i = first; i < width; ++i) {
    const int64_t s = attention_example_start(starts, i), row = (i - first) * width;
    causal_softmax_backward_row_bf16(p + row + s, dp + row + s, scratch, i + 1 - s, width - s, scale);
    std::fill_n(dp + row, s, uint16_t{0});
  }
}

namespace {

// Each row of the block through `apply` (dropout_apply or its bf16 twin),
// its mask drawn from the row's place in the whole sequence.
template <typename T, typename Apply>
void attention_dropout_rows(const T* in, T* out, int64_t first, int64_t count, int64_t positions, Apply&& apply) {
  const int64_t width = first + count;
  for (int64_t i = first; i < width; ++i) {
    const int64_t row = (i - first) * width;
    apply(in + row, out + row, width, static_cast<uint32_t>(i * positions));
  }
}

}  // namespace

void attention_dropout_block(const float* in, float* out, int64_t first, int64_t count, int64_t positions,
                             uint64_t seed, uint32_t threshold, float scale) {
  attention_dropout_rows(in, out, first, count, positions,
                         [&](const float* from, float* to, int64_t n, uint32_t offset) {
                           dropout_apply(from, to, n, offset, seed, threshold, scale);
                         });
}

void attention_dropout_block_bf16(const uint16_t* in, uint16_t* out, int64_t first, int64_t count, int64_t positions,
                                  uint64_t seed, uint32_t threshold, float scale) {
  attention_dropout_rows(in, out, first, count, positions,
                         [&](const uint16_t* from, uint16_t* to, int64_t n, uint32_t offset) {
                           dropout_apply_bf16(from, to, n, offset, seed, threshold, scale);
                         });
}

}  // namespace fsdp::kernels
