#include "fsdp/models/attention.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "fsdp/common/compat.h"
#include "fsdp/common/error.h"
#include "fsdp/nn/dropout.h"
#include "fsdp/nn/packed_rows.h"
#include "kernels/kernels.h"

namespace fsdp::models {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool dropout_active(torch::nn::Dropout* dropout) {
  return dropout != nullptr && (*dropout)->is_training() && (*dropout)->options.p() > 0;
}

double dropout_p(torch::nn::Dropout* dropout) { return dropout_active(dropout) ? (*dropout)->options.p() : 0.0; }

// LibTorch's ops, for other devices and dtypes and for attention dropout.
// Where query i of row b may not look: the future, and with packed rows
// the keys before its example's start. (T, T), or (B, 1, T, T) when packed.
Tensor hidden_keys(int64_t B, int64_t T, const Tensor& starts, const at::Device& device) {
  auto future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(device)).triu(1);
  if (!starts.defined() || starts.numel() == 0) return future;
  const auto keys = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(device));
  const auto before = keys.view({1, 1, T}) < starts.to(device).view({B, T, 1});  // (B, T, T)
  return (before | future.unsqueeze(0)).unsqueeze(1);
}

Tensor composite_attention(const Tensor& q, const Tensor& k, const Tensor& v, torch::nn::Dropout* dropout,
                           const Tensor& starts = Tensor()) {
  const int64_t B = q.size(0), T = q.size(1), nh = q.size(2), hs = q.size(3);
  auto qh = q.transpose(1, 2), kh = k.transpose(1, 2), vh = v.transpose(1, 2);  // (B, heads, T, hs)
  const int64_t rep = nh / k.size(2);
  if (rep > 1) {
    kh = kh.repeat_interleave(rep, 1);
    vh = vh.repeat_interleave(rep, 1);
  }
  auto scores = qh.matmul(kh.transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(hs)));
  auto weights =
      scores.masked_fill_(hidden_keys(B, T, starts, q.device()), -std::numeric_limits<float>::infinity()).softmax(-1);
  auto y = (dropout != nullptr ? nn::dropout(*dropout, weights) : weights).matmul(vh);  // itself when off
  return y.transpose(1, 2).reshape({B, T, nh * hs});
}

// bf16 attention takes MKL's bf16 products (bf16 operands, float results)
// where the process has them: the weights are then computed and kept in
// float, and rounded to bf16 only as an operand. Elsewhere its products go
// through ATen, on bf16 weights.
bool raw_bf16(const Tensor& t) { return t.scalar_type() == at::kBFloat16 && kernels::gemm_bf16_available(); }

// The weights' type: float but where bf16 goes through ATen.
at::ScalarType weights_type(const Tensor& t) { return raw_bf16(t) ? at::kFloat : t.scalar_type(); }

// Causal attention skips the future by blocks of query rows: rows [r0, r1)
// see keys [0, r1) only, so the square's products above the diagonal
// blocks are never computed (at T = 256 in blocks of 64, 10 of 16 remain).
// Smaller blocks skip more but make smaller products, which bf16 through
// ATen runs far less efficiently: per step of gpt2-d6 (T = 256, 4 x 6
// heads of 64), attention took 48 ms in fp32 with blocks of 64 or 128
// against 55 without skipping; in bf16 through ATen 62 ms with 64, 46 with
// 128 and 42 without (bench/profile_summary.py).
int64_t query_block(const Tensor& t) { return t.scalar_type() == at::kBFloat16 && !raw_bf16(t) ? 256 : 64; }

// A matrix in a tensor's memory, rows `ld` elements apart and columns
// adjacent, as BLAS takes it. The kernel works on these, not on tensor
// views: a head's block product is small (64 x 16 x 64 in a model of width
// 64), and making its views and dispatching it through ATen cost three
// times the product itself.
struct Mat {
  char* data;
  int64_t rows, cols, ld;
  at::ScalarType type;
  int64_t element_size() const { return type == at::kBFloat16 ? 2 : 4; }
  Mat rows_from(int64_t begin, int64_t count) const {
    return {data + begin * ld * element_size(), count, cols, ld, type};
  }
  float* floats() const { return reinterpret_cast<float*>(data); }
  uint16_t* bf16_bits() const { return reinterpret_cast<uint16_t*>(data); }
  Tensor tensor() const { return at::from_blob(data, {rows, cols}, {ld, 1}, at::TensorOptions().dtype(type)); }
};

// One head's (T, hs) matrix of a (B, T, heads, hs) tensor laid out as
// blas_layout() leaves it (a single row's stride is free: hs stands in).
Mat head(const Tensor& t, int64_t b, int64_t h) {
  return {static_cast<char*>(t.data_ptr()) + (b * t.stride(0) + h * t.stride(2)) * t.element_size(), t.size(1),
          t.size(3), t.size(1) == 1 ? t.size(3) : t.stride(1), t.scalar_type()};
}

// A thread's room for what gemm_bf16 converts, one per use (Slot).
template <typename T, int Slot>
T* thread_room(int64_t count) {
  thread_local std::vector<T> room;
  if (room.size() < static_cast<size_t>(count)) room.resize(count);
  return room.data();
}

// m as a bf16 operand: itself, or its floats rounded into `room`.
template <int Slot>
std::pair<const uint16_t*, int64_t> bf16_operand(const Mat& m) {
  if (m.type == at::kBFloat16) return {m.bf16_bits(), m.ld};
  auto* room = thread_room<uint16_t, Slot>(m.rows * m.cols);
  kernels::float_to_bf16_rows(m.floats(), m.ld, room, m.cols, m.rows, m.cols);
  return {room, m.cols};
}

// c = op(a) op(b), or c += it, by MKL's bf16 products: a float operand
// rounded to bf16 first, a bf16 c rounded once from the float result.
void gemm_bf16(const Mat& c, const Mat& a, bool trans_a, const Mat& b, bool trans_b, bool accumulate) {
  const int64_t k = trans_a ? a.rows : a.cols;
  const auto [A, lda] = bf16_operand<0>(a);
  const auto [B, ldb] = bf16_operand<1>(b);
  if (c.type == at::kFloat) {
    kernels::gemm_bf16_rows(trans_a, trans_b, c.rows, c.cols, k, 1.0f, A, lda, B, ldb, accumulate ? 1.0f : 0.0f,
                            c.floats(), c.ld);
    return;
  }
  FSDP_CHECK(!accumulate, "causal_attention: a bf16 result is written, not added to");
  float* result = thread_room<float, 2>(c.rows * c.cols);
  kernels::gemm_bf16_rows(trans_a, trans_b, c.rows, c.cols, k, 1.0f, A, lda, B, ldb, 0.0f, result, c.cols);
  kernels::float_to_bf16_rows(result, c.cols, c.bf16_bits(), c.ld, c.rows, c.cols);
}

// c = op(a) op(b), or c += it. fp32 goes to sgemm_ and bf16 to MKL's bf16
// products where the process has them; the rest, and empty heads, through
// ATen (bf16 into a float c: the product rounds to bf16 once, the sum
// stays float).
void gemm(const Mat& c, const Mat& a, bool trans_a, const Mat& b, bool trans_b, bool accumulate) {
  const int64_t k = trans_a ? a.rows : a.cols;
  const bool blas_shape = k > 0 && a.cols > 0 && b.cols > 0 && c.cols > 0;  // BLAS: ld >= 1
  const bool fp32 = a.type == at::kFloat && b.type == at::kFloat && c.type == at::kFloat;
  if (fp32 && kernels::sgemm_available() && blas_shape) {
    kernels::sgemm_rows(trans_a, trans_b, c.rows, c.cols, k, 1.0f, a.floats(), a.ld, b.floats(), b.ld,
                        accumulate ? 1.0f : 0.0f, c.floats(), c.ld);
    return;
  }
  if (!fp32 && kernels::gemm_bf16_available() && blas_shape) {
    gemm_bf16(c, a, trans_a, b, trans_b, accumulate);
    return;
  }
  const auto A = trans_a ? a.tensor().t() : a.tensor(), B = trans_b ? b.tensor().t() : b.tensor();
  auto C = c.tensor();
  if (!accumulate) {
    at::mm_out(C, A, B);
  } else if (c.type == a.type) {
    C.addmm_(A, B);
  } else {
    C.add_(at::mm(A, B));
  }
}

// A block's weights, rows [r0, r0 + n) of the (T, T) square cut at column
// r1 = r0 + n: an (n, r1) matrix in a thread's scratch, row i - r0 holding
// query i's i + 1 weights and zeros after them (the layout the
// kernels::attention_*_block functions take).
struct WeightBlock {
  Mat m;  // (n, r1), contiguous
  int64_t r0;
  int64_t n() const { return m.rows; }
  int64_t r1() const { return m.cols; }
};

WeightBlock block_of(const Tensor& scratch, int64_t r0, int64_t n) {
  return {{static_cast<char*>(scratch.data_ptr()), n, r0 + n, r0 + n, scratch.scalar_type()}, r0};
}

// Packed rows: the column where query i's example starts (its weights
// before it are zero), or 0 for every query.
struct ExampleStarts {
  const int64_t* row = nullptr;  // this batch row's T starts, or null
};

// Each query row's softmax over the keys of its example up to itself,
// [s, i], as the causal row kernel over the row from column s.
void softmax_rows(const WeightBlock& w, float scale, std::vector<float>& scratch, ExampleStarts starts) {
  if (w.m.type == at::kBFloat16) {
    kernels::attention_softmax_block_bf16(w.m.bf16_bits(), scratch.data(), w.r0, w.n(), starts.row, scale);
  } else {
    kernels::attention_softmax_block(w.m.floats(), w.r0, w.n(), starts.row, scale);
  }
}

// dp becomes the scores' gradient, from the weights p and their gradient.
void softmax_backward_rows(const WeightBlock& p, const WeightBlock& dp, float scale, std::vector<float>& scratch,
                           ExampleStarts starts) {
  if (p.m.type == at::kBFloat16) {
    kernels::attention_softmax_backward_block_bf16(p.m.bf16_bits(), dp.m.bf16_bits(), scratch.data(), p.r0, p.n(),
                                                   starts.row, scale);
  } else {
    kernels::attention_softmax_backward_block(p.m.floats(), dp.m.floats(), p.r0, p.n(), starts.row, scale);
  }
}

// Dropout on the attention weights, inside the kernel: the call draws one
// key (nn::dropout_key), each (batch, query head) pair hashes with its own
// key derived from it, and weight (i, j) of a head is element i * T + j of
// its (T, T) square, whatever the blocking. Backward recomputes the mask,
// so nothing of the square is stored. `first` counts in 32 bits, so the
// kernel takes dropout up to T = 65,535 (longer goes to the composite).
struct WeightDropout {
  double p = 0;
  uint64_t key = 0;
  // The call's: a key drawn only when dropout is on.
  static WeightDropout draw(double p) { return {p, p > 0 ? nn::dropout_key() : 0}; }
  bool active() const { return p > 0; }
  uint64_t head_key(int64_t b, int64_t h, int64_t nh) const {
    return key + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(b * nh + h + 1);
  }
};
constexpr int64_t kMaxDropoutPositions = 65535;

// out's rows = in's rows with the head's mask (scaled by 1 / (1 - p));
// in and out may be the same block. Whole rows, so out's zeros after the
// diagonal are written too.
void drop_rows(const WeightBlock& in, const WeightBlock& out, int64_t T, const WeightDropout& d, uint64_t key) {
  const uint32_t threshold = kernels::dropout_threshold(d.p);
  const auto scale = static_cast<float>(1.0 / (1.0 - d.p));
  if (in.m.type == at::kBFloat16) {
    kernels::attention_dropout_block_bf16(in.m.bf16_bits(), out.m.bf16_bits(), in.r0, in.n(), T, key, threshold, scale);
  } else {
    kernels::attention_dropout_block(in.m.floats(), out.m.floats(), in.r0, in.n(), T, key, threshold, scale);
  }
}

float softmax_scale(const Tensor& q) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(q.size(3)))); }

// The state a task thread needs to run ATen ops on saved inputs: autograd
// off (worker threads start with it on, and the inputs require grad), and
// no profiler events, so the enclosing range's time is the whole work on
// every thread rather than the calling thread's share of it.
struct TaskThreadState {
  at::NoGradGuard no_grad;
  at::RecordFunctionGuard no_events{false};
};

// A thread's room for one block of weights: block x T elements, so memory
// grows with T, not T^2.
Tensor block_scratch(const Tensor& like, int64_t T) {
  return at::empty({query_block(like) * T}, like.options().dtype(weights_type(like)));
}

// y (B, T, nh, hs) from q, k, v (B, T, heads, hs). Each (batch, query
// head) pair is one task, its matmuls single-threaded inside the parallel
// region: many small products side by side keep the cores busier than one
// multi-threaded product after another. A block of query rows gets its
// scores, softmax (and dropout) in the thread's scratch and multiplies
// them into its rows of y; no (T, T) matrix is kept.
// `starts`: packed rows' example starts, (B, T) int64 on the CPU, or empty.
ExampleStarts starts_of(const Tensor& starts, int64_t b) {
  return {starts.numel() > 0 ? starts.data_ptr<int64_t>() + b * starts.size(1) : nullptr};
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const WeightDropout& drop,
                       const Tensor& y, const Tensor& starts) {
  RECORD_USER_SCOPE("fsdp::causal_attention");
  const int64_t B = q.size(0), T = q.size(1), nh = q.size(2), rep = nh / k.size(2);
  const float scale = softmax_scale(q);
  const int64_t block = query_block(q);
  at::parallel_for(0, B * nh, 1, [&](int64_t begin, int64_t end) {
    TaskThreadState state;
    std::vector<float> scratch(T);
    const auto weights = block_scratch(q, T);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / nh, h = task % nh, g = h / rep;
      const auto q_h = head(q, b, h), k_g = head(k, b, g), v_g = head(v, b, g), y_h = head(y, b, h);
      for (int64_t r0 = 0; r0 < T; r0 += block) {
        const int64_t n = std::min(T, r0 + block) - r0;
        const auto w = block_of(weights, r0, n);
        gemm(w.m, q_h.rows_from(r0, n), false, k_g.rows_from(0, w.r1()), true, false);
        softmax_rows(w, scale, scratch, starts_of(starts, b));
        if (drop.active()) drop_rows(w, w, T, drop, drop.head_key(b, h, nh));
        gemm(y_h.rows_from(r0, n), w.m, false, v_g.rows_from(0, w.r1()), false, false);
      }
    }
  });
}

// Sums a key/value head's gradient over its query heads and query blocks:
// in place for fp32; for bf16 in a float copy (each block's product
// rounds once, the sum does not), written back at the end.
class HeadGradient {
 public:
  // `room`: the thread's float buffer of at least T * hs, for bf16.
  HeadGradient(const Mat& grad, const Tensor& room) : grad_(grad), sum_(grad) {
    if (grad.type != at::kFloat) {
      sum_ = {static_cast<char*>(room.data_ptr()), grad.rows, grad.cols, grad.cols, at::kFloat};
    }
    for (int64_t r = 0; r < sum_.rows; ++r) std::fill_n(sum_.rows_from(r, 1).floats(), sum_.cols, 0.0f);
  }
  // rows [0, a.cols) += a^T b
  void add(const Mat& a, const Mat& b) { gemm(sum_.rows_from(0, a.cols), a, true, b, false, true); }
  void finish() {
    if (grad_.type != at::kFloat) grad_.tensor().copy_(sum_.tensor());
  }

 private:
  Mat grad_, sum_;
};

// dq, dk, dv (B, T, heads, hs), every element written. One task per
// (batch, key/value head): the query heads sharing it add into its dk and
// dv one after another, so no two threads write the same rows. Each block
// of query rows recomputes its weights from q and k (as forward did, the
// same products in the same order, so the same values), then takes its
// share of every gradient: dq's rows whole, and its addition to the rows
// of dk and dv it saw.
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const WeightDropout& drop, const Tensor& dy,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& starts) {
  RECORD_USER_SCOPE("fsdp::causal_attention_backward");
  const int64_t B = q.size(0), T = q.size(1), nh = q.size(2), nkv = k.size(2), rep = nh / nkv;
  const float scale = softmax_scale(q);
  const int64_t block = query_block(q);
  at::parallel_for(0, B * nkv, 1, [&](int64_t begin, int64_t end) {
    TaskThreadState state;
    std::vector<float> scratch(T);
    const auto weights = block_scratch(q, T), dweights = block_scratch(q, T);
    const auto dropped = drop.active() ? block_scratch(q, T) : Tensor();
    const bool bf16 = q.scalar_type() == at::kBFloat16;
    const auto float_room = [&] { return bf16 ? at::empty({T * q.size(3)}, q.options().dtype(at::kFloat)) : Tensor(); };
    const auto dk_room = float_room(), dv_room = float_room();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / nkv, g = task % nkv;
      const auto k_g = head(k, b, g), v_g = head(v, b, g);
      HeadGradient dk_g(head(dk, b, g), dk_room), dv_g(head(dv, b, g), dv_room);
      for (int64_t r = 0; r < rep; ++r) {
        const int64_t h = g * rep + r;
        const auto dy_h = head(dy, b, h), q_h = head(q, b, h), dq_h = head(dq, b, h);
        for (int64_t r0 = 0; r0 < T; r0 += block) {
          const int64_t n = std::min(T, r0 + block) - r0;
          const auto p = block_of(weights, r0, n), dp = block_of(dweights, r0, n);
          const auto q_rows = q_h.rows_from(r0, n), dy_rows = dy_h.rows_from(r0, n);
          const auto keys = k_g.rows_from(0, p.r1()), values = v_g.rows_from(0, p.r1());
          gemm(p.m, q_rows, false, keys, true, false);
          softmax_rows(p, scale, scratch, starts_of(starts, b));
          gemm(dp.m, dy_rows, false, values, true, false);
          auto used = p;  // the weights y was made of
          if (drop.active()) {
            const uint64_t key = drop.head_key(b, h, nh);
            used = block_of(dropped, r0, n);
            drop_rows(p, used, T, drop, key);
            drop_rows(dp, dp, T, drop, key);
          }
          dv_g.add(used.m, dy_rows);
          softmax_backward_rows(p, dp, scale, scratch, starts_of(starts, b));
          gemm(dq_h.rows_from(r0, n), dp.m, false, keys, false, false);
          dk_g.add(dp.m, q_rows);
        }
      }
      dk_g.finish();
      dv_g.finish();
    }
  });
}

// BLAS takes a head as rows at least hs apart with adjacent columns; other
// views (an expanded or transposed one, say) are copied first.
Tensor blas_layout(const Tensor& t) {
  return t.stride(3) == 1 && (t.size(1) == 1 || t.stride(1) >= t.size(3)) ? t : t.contiguous();
}

void check_heads(const Tensor& q, const Tensor& k, const Tensor& v) {
  FSDP_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "causal_attention: q, k and v must be (B, T, heads, hs)");
  FSDP_CHECK(k.sizes() == v.sizes() && q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3),
             "causal_attention: q ", q.sizes(), ", k ", k.sizes(), " and v ", v.sizes(), " do not match");
  FSDP_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, "causal_attention: ", q.size(2),
             " query heads are not a multiple of ", k.size(2), " key/value heads");
}

void save_dropout(AutogradContext* ctx, const WeightDropout& d) {
  ctx->saved_data["p"] = d.p;
  ctx->saved_data["key"] = static_cast<int64_t>(d.key);
}

WeightDropout saved_dropout(AutogradContext* ctx) {
  return {ctx->saved_data["p"].toDouble(), static_cast<uint64_t>(ctx->saved_data["key"].toInt())};
}

// The example starts forward ran with (empty: none).
Tensor saved_starts(AutogradContext* ctx) { return ctx->saved_data["starts"].toTensor(); }

struct CausalAttention : public torch::autograd::Function<CausalAttention> {
  static Tensor forward(AutogradContext* ctx, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, double p,
                        const Tensor& starts) {
    const auto q = blas_layout(q_in), k = blas_layout(k_in), v = blas_layout(v_in);
    const int64_t B = q.size(0), T = q.size(1), nh = q.size(2), hs = q.size(3);
    const auto drop = WeightDropout::draw(p);
    auto y = at::empty({B, T, nh, hs}, q.options());
    attention_forward(q, k, v, drop, y, starts);
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["starts"] = starts;
    save_dropout(ctx, drop);
    return y.view({B, T, nh * hs});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2];
    const auto dy = grad_outputs[0].to(q.scalar_type()).contiguous().view(q.sizes());
    auto dq = at::empty(q.sizes(), q.options()), dk = at::empty(k.sizes(), k.options());
    auto dv = at::empty(v.sizes(), v.options());
    attention_backward(q, k, v, saved_dropout(ctx), dy, dq, dk, dv, saved_starts(ctx));
    return {dq, dk, dv, Tensor(), Tensor()};
  }
};

// qkv (B, T, 3 * nh * hs) seen as (B, T, 3, nh, hs): part i is q, k or v.
Tensor packed_part(const Tensor& qkv, int64_t n_head, int64_t i) {
  const int64_t B = qkv.size(0), T = qkv.size(1), hs = qkv.size(2) / (3 * n_head);
  return qkv.reshape({B, T, 3, n_head, hs}).select(2, i);
}

struct PackedCausalAttention : public torch::autograd::Function<PackedCausalAttention> {
  static Tensor forward(AutogradContext* ctx, const Tensor& qkv_in, int64_t n_head, double p, const Tensor& starts) {
    const auto qkv = qkv_in.contiguous();
    const auto q = packed_part(qkv, n_head, 0);
    const int64_t B = q.size(0), T = q.size(1), hs = q.size(3);
    const auto drop = WeightDropout::draw(p);
    auto y = at::empty({B, T, n_head, hs}, q.options());
    attention_forward(q, packed_part(qkv, n_head, 1), packed_part(qkv, n_head, 2), drop, y, starts);
    ctx->save_for_backward({qkv});
    ctx->saved_data["starts"] = starts;
    ctx->saved_data["n_head"] = n_head;
    save_dropout(ctx, drop);
    return y.view({B, T, n_head * hs});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& qkv = saved[0];
    const int64_t n_head = ctx->saved_data["n_head"].toInt();
    const auto q = packed_part(qkv, n_head, 0);
    const auto dy = grad_outputs[0].to(qkv.scalar_type()).contiguous().view(q.sizes());
    auto dqkv = at::empty(qkv.sizes(), qkv.options());
    attention_backward(q, packed_part(qkv, n_head, 1), packed_part(qkv, n_head, 2), saved_dropout(ctx), dy,
                       packed_part(dqkv, n_head, 0), packed_part(dqkv, n_head, 1), packed_part(dqkv, n_head, 2),
                       saved_starts(ctx));
    return {dqkv, Tensor(), Tensor(), Tensor()};
  }
};

// On a GPU, LibTorch's fused attention (flash, cuDNN or memory-efficient,
// as it chooses): no (T, T) matrix in memory, dropout inside the kernel
// (drawn from the device's generator, which checkpointing replays).
// Packed rows (`starts` defined) pass a block-diagonal causal mask, which
// the memory-efficient kernel takes (flash takes none): (B, 1, T, T).
Tensor device_attention(const Tensor& q, const Tensor& k, const Tensor& v, torch::nn::Dropout* dropout,
                        const Tensor& starts = Tensor()) {
  const int64_t B = q.size(0), T = q.size(1), nh = q.size(2), hs = q.size(3);
  auto qh = q.transpose(1, 2), kh = k.transpose(1, 2), vh = v.transpose(1, 2);  // (B, heads, T, hs)
  const double p = dropout_p(dropout);
#if FSDP_TORCH_VERSION >= 200
  const bool packed = starts.defined() && starts.numel() > 0;
  const std::optional<Tensor> mask =
      packed ? std::optional<Tensor>(hidden_keys(B, T, starts, q.device()).logical_not()) : std::nullopt;
  const bool causal = !packed;
#endif
#if FSDP_TORCH_VERSION >= 205
  bool grouped = nh != k.size(2);
  if (grouped && packed) {
    // With a mask, enable_gqa leaves only the math backend (the whole
    // score square per head): repeated k and v keep the memory-efficient one.
    const int64_t rep = nh / k.size(2);
    kh = kh.repeat_interleave(rep, 1);
    vh = vh.repeat_interleave(rep, 1);
    grouped = false;
  }
  auto y = at::scaled_dot_product_attention(qh, kh, vh, mask, p, causal, /*scale=*/{}, /*enable_gqa=*/grouped);
#elif FSDP_TORCH_VERSION >= 200
  if (const int64_t rep = nh / k.size(2); rep > 1) {
    kh = kh.repeat_interleave(rep, 1);
    vh = vh.repeat_interleave(rep, 1);
  }
  auto y = at::scaled_dot_product_attention(qh, kh, vh, mask, p, causal);
#else
  (void)p;
  auto y = composite_attention(q, k, v, dropout, starts).view({B, T, nh, hs}).transpose(1, 2);  // never reached: see on_gpu
#endif
  return y.transpose(1, 2).reshape({B, T, nh * hs});
}

bool on_gpu(const Tensor& t) {
#if FSDP_TORCH_VERSION >= 200
  return t.is_cuda();
#else
  (void)t;
  return false;  // LibTorch 1.13 has no fused attention; its CPU build has no GPU
#endif
}

// The CPU kernel takes fp32 and bf16, with dropout below 1 (p = 1 drops
// everything: the composite's) over at most kMaxDropoutPositions.
bool fused(const Tensor& t, torch::nn::Dropout* dropout) {
  const double p = dropout_p(dropout);
  return t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16) && p < 1 &&
         (p == 0 || t.size(1) <= kMaxDropoutPositions);
}

}  // namespace

namespace {

// The current packed rows' example starts for q (B, T, ...), on the CPU,
// contiguous; empty when none (the autograd functions take a tensor).
Tensor example_starts(const Tensor& q) {
  const nn::PackedRows* rows = nn::packed_rows_for(q.size(0), q.size(1));
  return rows != nullptr ? rows->starts.to(torch::kCPU).to(torch::kLong).contiguous()
                         : at::empty({0}, at::TensorOptions().dtype(at::kLong));
}

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, torch::nn::Dropout* dropout) {
  check_heads(q, k, v);
  const Tensor starts = example_starts(q);
  if (on_gpu(q)) return device_attention(q, k, v, dropout, starts);
  if (!fused(q, dropout) || k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) {
    return composite_attention(q, k, v, dropout, starts);
  }
  return CausalAttention::apply(q, k, v, dropout_p(dropout), starts);
}

Tensor causal_attention_packed(const Tensor& qkv, int64_t n_head, torch::nn::Dropout* dropout) {
  FSDP_CHECK(qkv.dim() == 3 && n_head > 0 && qkv.size(2) % (3 * n_head) == 0, "causal_attention_packed: qkv ",
             qkv.sizes(), " is not (B, T, 3 * ", n_head, " * head size)");
  if (on_gpu(qkv) || !fused(qkv, dropout)) {
    // unbind, not three selects: its backward writes dqkv with one stack,
    // where each select's would fill a zero qkv-sized tensor to be summed.
    const int64_t B = qkv.size(0), T = qkv.size(1), hs = qkv.size(2) / (3 * n_head);
    const auto parts = qkv.reshape({B, T, 3, n_head, hs}).unbind(2);
    const Tensor starts = example_starts(parts[0]);
    return on_gpu(qkv) ? device_attention(parts[0], parts[1], parts[2], dropout, starts)
                       : composite_attention(parts[0], parts[1], parts[2], dropout, starts);
  }
  return PackedCausalAttention::apply(qkv, n_head, dropout_p(dropout), example_starts(packed_part(qkv, n_head, 0)));
}

}  // namespace fsdp::models
