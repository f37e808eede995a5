// Causal attention (fsdp::models::causal_attention and its packed form)
// against the textbook computation in double: scores, a -inf mask above the
// diagonal, softmax, weighted values; gradients by autograd through it.
// Covers grouped-query heads, strided views as inputs, odd lengths, bf16,
// dropout on the weights, memory that grows with T rather than T^2, the
// composite path for other dtypes, thread-count independence, and the
// products through ATen where the process has no sgemm_ or MKL's bf16
// products.

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <string>

#include "fsdp/common/allocation_log.h"
#include "fsdp/common/flat_buffer.h"
#include "fsdp/common/error.h"
#include "fsdp/models/attention.h"
#include "fsdp/nn/activation_checkpoint.h"
#include "fsdp/nn/packed_rows.h"
#include "kernels/kernels.h"
#include "../nn/dispatched_operators.h"

namespace fsdp::models::attention_test {
namespace {

using torch::Tensor;

// q (B, T, nh, hs), k and v (B, T, nkv, hs), in double.
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t B = q.size(0), T = q.size(1), nh = q.size(2), hs = q.size(3), rep = nh / k.size(2);
  auto qh = q.transpose(1, 2), kh = k.transpose(1, 2).repeat_interleave(rep, 1);
  auto vh = v.transpose(1, 2).repeat_interleave(rep, 1);
  auto scores = torch::matmul(qh, kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(hs));
  auto above = torch::ones({T, T}, torch::kBool).triu(1);
  auto probs = torch::softmax(scores.masked_fill(above, -std::numeric_limits<double>::infinity()), -1);
  return torch::matmul(probs, vh).transpose(1, 2).reshape({B, T, nh * hs});
}

struct Result {
  Tensor y, dq, dk, dv;
};

// Runs `attend` on copies of the inputs in `dtype` with incoming gradient dy.
template <typename F>
Result run(F attend, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dy, torch::ScalarType dtype) {
  const auto leaf = [&](const Tensor& t) { return t.detach().to(dtype, false, /*copy=*/true).requires_grad_(); };
  auto qd = leaf(q), kd = leaf(k), vd = leaf(v);
  auto y = attend(qd, kd, vd);
  y.backward(dy.to(dtype));
  return {y.detach(), qd.grad(), kd.grad(), vd.grad()};
}

// Largest |a - b| relative to b's largest magnitude (absolute where b is
// all zeros: with T = 1 the scores get no gradient).
double gap(const Tensor& a, const Tensor& b) {
  return (a.to(torch::kDouble) - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-300);
}

void expect_close(const Result& a, const Result& exact, double tol) {
  EXPECT_LT(gap(a.y, exact.y), tol) << "output";
  EXPECT_LT(gap(a.dq, exact.dq), tol) << "dq";
  EXPECT_LT(gap(a.dk, exact.dk), tol) << "dk";
  EXPECT_LT(gap(a.dv, exact.dv), tol) << "dv";
}

struct Inputs {
  Tensor q, k, v, dy;
};

Inputs inputs(int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hs) {
  torch::manual_seed(5);
  // Scores of a few units, so the softmax is neither flat nor one-hot.
  return {torch::randn({B, T, nh, hs}, torch::kDouble) * 2, torch::randn({B, T, nkv, hs}, torch::kDouble) * 2,
          torch::randn({B, T, nkv, hs}, torch::kDouble), torch::randn({B, T, nh * hs}, torch::kDouble)};
}

Result exact(const Inputs& in) { return run(reference, in.q, in.k, in.v, in.dy, torch::kDouble); }

const auto attend = [](const Tensor& q, const Tensor& k, const Tensor& v) { return causal_attention(q, k, v); };

TEST(CausalAttention, Fp32MatchesTheReferenceWithGroupedQueryHeads) {
  for (int64_t T : {1, 2, 37, 64}) {
    const auto in = inputs(2, T, 6, 2, 16);
    expect_close(run(attend, in.q, in.k, in.v, in.dy, torch::kFloat), exact(in), 2e-6);
  }
}

TEST(CausalAttention, Fp32MatchesTheReferenceAcrossQueryBlocks) {
  // Longer than one 64-row block of queries, with a ragged last block, and
  // exactly two blocks: the skipped future and the block edges.
  for (int64_t T : {128, 150}) {
    const auto in = inputs(2, T, 4, 2, 16);
    expect_close(run(attend, in.q, in.k, in.v, in.dy, torch::kFloat), exact(in), 5e-6);
  }
}

// Packed rows (nn/packed_rows.h): each example of a row attends to
// itself alone, as if it were a row of its own. The reference runs the
// textbook computation on each example's slice separately and puts the
// pieces side by side; the rows span several query blocks, with examples
// of one token and examples that cross a block's edge.
Tensor reference_by_example(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<std::vector<int64_t>>& cuts) {
  std::vector<Tensor> rows;
  for (int64_t b = 0; b < q.size(0); ++b) {
    std::vector<Tensor> pieces;
    for (size_t e = 0; e + 1 < cuts[b].size(); ++e) {
      const int64_t s = cuts[b][e], n = cuts[b][e + 1] - s;
      const auto slice = [&](const Tensor& t) { return t.narrow(0, b, 1).narrow(1, s, n); };
      pieces.push_back(reference(slice(q), slice(k), slice(v)));
    }
    rows.push_back(torch::cat(pieces, 1));
  }
  return torch::cat(rows, 0);
}

TEST(CausalAttention, PackedRowsAttendInsideEachExampleAsIfItWereARow) {
  const int64_t B = 2, T = 150;
  const std::vector<std::vector<int64_t>> cuts = {{0, 40, 41, 130, 150}, {0, 63, 65, 150}};
  nn::PackedRows packed{torch::empty({B, T}, torch::kLong), torch::empty({B, T}, torch::kLong)};
  for (int64_t b = 0; b < B; ++b) {
    for (size_t e = 0; e + 1 < cuts[b].size(); ++e) {
      for (int64_t t = cuts[b][e]; t < cuts[b][e + 1]; ++t) {
        packed.starts[b][t] = cuts[b][e];
        packed.positions[b][t] = t - cuts[b][e];
      }
    }
  }
  const auto in = inputs(B, T, 4, 2, 16);
  const auto by_example = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
    return reference_by_example(q, k, v, cuts);
  };
  const Result expected = run(by_example, in.q, in.k, in.v, in.dy, torch::kDouble);
  nn::PackedRowsScope scope(packed);
  expect_close(run(attend, in.q, in.k, in.v, in.dy, torch::kFloat), expected, 5e-6);  // the CPU kernel
  expect_close(run(attend, in.q, in.k, in.v, in.dy, torch::kDouble), expected, 1e-12);  // the composite
  expect_close(run(attend, in.q, in.k, in.v, in.dy, torch::kBFloat16), expected, 3e-2);
  // The whole row's causal attention is another computation: the check above can fail.
  const Tensor unpacked = reference(in.q, in.k, in.v);
  EXPECT_GT(gap(unpacked, expected.y), 1e-2);
  // A scope of another shape is refused, naming both.
  nn::PackedRows other{torch::zeros({1, T}, torch::kLong), torch::zeros({1, T}, torch::kLong)};
  nn::PackedRowsScope inner(other);
  EXPECT_THROW(causal_attention(in.q.to(torch::kFloat), in.k.to(torch::kFloat), in.v.to(torch::kFloat)), Error);
}

// Activation checkpointing recomputes a block in backward, which on a GPU
// runs on autograd's device thread, outside the trainer's scope: the
// checkpoint carries the packed rows of its forward. Here the scope is gone
// before backward; the gradients are those of the scope's attention.
TEST(CausalAttention, ACheckpointedBlockRecomputesUnderThePackedRowsOfItsForward) {
  const int64_t B = 1, T = 90;
  nn::PackedRows packed{torch::empty({B, T}, torch::kLong), torch::empty({B, T}, torch::kLong)};
  for (int64_t t = 0; t < T; ++t) {
    const int64_t start = t < 50 ? 0 : 50;
    packed.starts[0][t] = start;
    packed.positions[0][t] = t - start;
  }
  torch::manual_seed(3);
  const Tensor x0 = torch::randn({B, T, 2, 16}) * 2, dy = torch::randn({B, T, 32});
  const auto block = [](const Tensor& x) { return causal_attention(x, x * 0.5, x.flip(1)); };
  Tensor expected;
  {
    nn::PackedRowsScope scope(packed);
    const Tensor x = x0.clone().requires_grad_();
    block(x).backward(dy);
    expected = x.grad();
  }
  const Tensor x = x0.clone().requires_grad_();
  Tensor y;
  {
    nn::PackedRowsScope scope(packed);
    y = nn::checkpoint([&](const Tensor& in) { return block(in); }, x);
  }
  y.backward(dy);  // no scope now
  EXPECT_LT(gap(x.grad(), expected.to(torch::kDouble)), 1e-6);
  // Without the rows the gradient is another one: the check can fail.
  const Tensor plain = x0.clone().requires_grad_();
  block(plain).backward(dy);
  EXPECT_GT(gap(plain.grad(), expected.to(torch::kDouble)), 1e-3);
}

TEST(CausalAttention, QueriesNeverTouchKeyBlocksAfterTheirOwn) {
  // fp32 runs in blocks of 64 query rows. A NaN in the last value row
  // reaches an output row only through a product that includes it: with
  // the whole T x T square multiplied, the zero weights of the future still
  // make 0 * NaN = NaN in every row. The rows of earlier blocks must stay
  // finite, in forward and in q's gradient (k's takes every later query's
  // row, and with it the NaN).
  const int64_t T = 150, last_block = 128;
  const auto in = inputs(1, T, 2, 2, 8);
  auto v = in.v.to(torch::kFloat);
  v.select(1, T - 1).fill_(std::numeric_limits<float>::quiet_NaN());
  const auto r = run(attend, in.q, in.k, v, in.dy, torch::kFloat);
  EXPECT_TRUE(torch::isfinite(r.y.narrow(1, 0, last_block)).all().item<bool>());
  EXPECT_TRUE(torch::isnan(r.y.narrow(1, last_block, T - last_block)).any().item<bool>());
  EXPECT_TRUE(torch::isfinite(r.dq.narrow(1, 0, last_block)).all().item<bool>());
}

TEST(CausalAttention, Fp32TakesStridedHeadViewsAsTheyCome) {
  // Heads as the models pass them: token-major views into wider tensors
  // (every other column of a (B, T, 2 * nh * hs) buffer) and transposed
  // (B, heads, T, hs) storage.
  const auto in = inputs(2, 29, 4, 4, 8);
  const auto strided = [](const Tensor& q, const Tensor& k, const Tensor& v) {
    auto q_view = torch::cat({q, torch::zeros_like(q)}, 3).narrow(3, 0, q.size(3));
    auto k_view = k.transpose(1, 2).contiguous().transpose(1, 2);
    EXPECT_FALSE(q_view.is_contiguous());
    EXPECT_FALSE(k_view.is_contiguous());
    return causal_attention(q_view, k_view, v);
  };
  expect_close(run(strided, in.q, in.k, in.v, in.dy, torch::kFloat), exact(in), 2e-6);
}

// Strides BLAS cannot take as a head's rows: v expanded along T (rows 0
// apart), and one token whose T stride is smaller than a head.
void expect_expanded_and_single_token_views_taken_as_their_values() {
  torch::manual_seed(12);
  const auto q = torch::randn({2, 5, 2, 8}), k = torch::randn({2, 5, 2, 8});
  const auto v = torch::randn({2, 1, 2, 8}).expand({2, 5, 2, 8});
  const auto d = [](const Tensor& t) { return t.to(torch::kDouble); };
  EXPECT_TRUE(torch::allclose(d(causal_attention(q, k, v)), reference(d(q), d(k), d(v)), 1e-5, 1e-6));
  const auto one = torch::randn({32}).as_strided({2, 1, 2, 8}, {16, 1, 8, 1});
  EXPECT_TRUE(torch::allclose(d(causal_attention(one, one, one)), reference(d(one), d(one), d(one)), 1e-5, 1e-6));
}

TEST(CausalAttention, ExpandedAndSingleTokenViewsAreTakenAsTheirValues) {
  expect_expanded_and_single_token_views_taken_as_their_values();
}

TEST(CausalAttention, PackedProjectionMatchesTheReference) {
  const int64_t B = 3, T = 33, nh = 4, hs = 16, C = nh * hs;
  torch::manual_seed(6);
  auto qkv = torch::randn({B, T, 3 * C}, torch::kDouble) * 2;
  auto dy = torch::randn({B, T, C}, torch::kDouble);
  const auto parts = [&](const Tensor& t, int64_t i) { return t.narrow(2, i * C, C).reshape({B, T, nh, hs}); };
  auto exact_in = qkv.clone().requires_grad_();
  auto y_exact = reference(parts(exact_in, 0), parts(exact_in, 1), parts(exact_in, 2));
  y_exact.backward(dy);
  auto ours_in = qkv.to(torch::kFloat).requires_grad_();
  auto y = causal_attention_packed(ours_in, nh);
  y.backward(dy.to(torch::kFloat));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{B, T, C}));
  EXPECT_LT(gap(y, y_exact.detach()), 2e-6);
  EXPECT_LT(gap(ours_in.grad(), exact_in.grad()), 2e-6);
}

// While alive, the process's BLAS symbols read as absent (kernels.h).
struct BlasHidden {
  BlasHidden() { kernels::set_blas_hidden_for_testing(true); }
  ~BlasHidden() { kernels::set_blas_hidden_for_testing(false); }
};

void expect_bf16_within_rounding() {
  // bf16 keeps 8 bits: inputs, weights and outputs each round once (2^-8
  // relative; scores too through ATen), and the products sum up to a
  // hundred or so of them. 300: past the 256-row block of queries bf16
  // takes through ATen (64 with MKL's products).
  for (int64_t T : {40, 150, 300}) {
    const auto in = inputs(1, T, 2, 1, 16);
    expect_close(run(attend, in.q, in.k, in.v, in.dy, torch::kBFloat16), exact(in), 3e-2);
  }
}

TEST(CausalAttention, Bf16IsWithinBf16RoundingOfTheReference) {
  if (!kernels::gemm_bf16_available()) std::cout << "bf16 products go through ATen: this BLAS has no bf16 gemm\n";
  expect_bf16_within_rounding();
}

// MKL's bf16 products keep the scores and weights in float: a bf16 step
// lands nearer the reference than through ATen, where they round to bf16.
TEST(CausalAttention, Bf16WithMklsProductsKeepsTheScoresInFloat) {
  if (!kernels::gemm_bf16_available()) GTEST_SKIP() << "this BLAS has no bf16 gemm: attention multiplies through ATen";
  const auto in = inputs(2, 150, 4, 2, 32);
  const auto reference = exact(in);
  const auto ours = run(attend, in.q, in.k, in.v, in.dy, torch::kBFloat16);
  Result aten;
  {
    BlasHidden hidden;
    aten = run(attend, in.q, in.k, in.v, in.dy, torch::kBFloat16);
  }
  expect_close(ours, reference, 3e-2);
  EXPECT_LT(gap(ours.y, reference.y), gap(aten.y, reference.y)) << "output";
  EXPECT_LT(gap(ours.dq, reference.dq), gap(aten.dq, reference.dq)) << "dq";
}

// Attention dropout, seen through values that are one-hot rows: with
// v[b, j, g, :] = e_j, output y[b, i, h, j] is query i's dropped weight on
// key j, so the mask the kernel drew can be read off and the whole
// computation checked against the reference in double with that mask.
TEST(CausalAttention, DropoutOnTheWeightsMatchesTheReferenceWithTheMaskItDrew) {
  const int64_t B = 2, T = 100, nh = 4, nkv = 2, hs = 128;  // fp32 blocks of 64: two, the last ragged
  const double p = 0.3;
  auto in = inputs(B, T, nh, nkv, hs);
  in.v = torch::eye(T, hs, torch::kDouble).view({1, T, 1, hs}).expand({B, T, nkv, hs}).contiguous();
  torch::nn::Dropout dropout(p);
  const auto dropped = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
    return causal_attention(q, k, v, &dropout);
  };
  const auto ours = run(dropped, in.q, in.k, in.v, in.dy, torch::kFloat);

  // The weights without dropout, in double, (B, nh, T, T); y's first T
  // columns per head are the dropped weights.
  const int64_t rep = nh / nkv;
  auto kh = in.k.transpose(1, 2).repeat_interleave(rep, 1);
  auto scores = torch::matmul(in.q.transpose(1, 2), kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(hs));
  auto above = torch::ones({T, T}, torch::kBool).triu(1);
  auto probs = torch::softmax(scores.masked_fill(above, -std::numeric_limits<double>::infinity()), -1);
  auto seen = ours.y.to(torch::kDouble).view({B, T, nh, hs}).narrow(3, 0, T).transpose(1, 2);  // (B, nh, T, T)
  auto kept = seen.ne(0);
  auto visible = above.logical_not().expand_as(kept);
  const double fraction = 1.0 - kept.logical_and(visible).sum().item<double>() / visible.sum().item<double>();
  const double n = visible.sum().item<double>(), sigma = std::sqrt(p * (1 - p) / n);
  EXPECT_NEAR(fraction, p, 5 * sigma) << "dropped fraction";
  EXPECT_LT(gap(seen.masked_select(kept), (probs / (1 - p)).masked_select(kept)), 2e-6) << "kept weights scaled";

  // Every pair of heads and batches draws its own mask.
  EXPECT_FALSE(torch::equal(kept.select(1, 0), kept.select(1, 1)));
  EXPECT_FALSE(torch::equal(kept.select(0, 0), kept.select(0, 1)));

  const auto with_mask = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
    const auto rep_k = k.transpose(1, 2).repeat_interleave(rep, 1), rep_v = v.transpose(1, 2).repeat_interleave(rep, 1);
    auto s = torch::matmul(q.transpose(1, 2), rep_k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hs));
    auto w = torch::softmax(s.masked_fill(above, -std::numeric_limits<double>::infinity()), -1);
    return torch::matmul(w * kept.to(torch::kDouble) / (1 - p), rep_v).transpose(1, 2).reshape({B, T, nh * hs});
  };
  expect_close(ours, run(with_mask, in.q, in.k, in.v, in.dy, torch::kDouble), 5e-6);
}

TEST(CausalAttention, DropoutReplaysItsMaskFromARestoredGenerator) {
  // What activation checkpointing relies on: the same generator state,
  // the same mask; a different state, another.
  const auto in = inputs(1, 70, 2, 2, 16);
  torch::nn::Dropout dropout(0.5);
  const auto dropped = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
    return causal_attention(q, k, v, &dropout);
  };
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    torch::manual_seed(11);
    const auto first = run(dropped, in.q, in.k, in.v, in.dy, dtype);
    torch::manual_seed(11);
    const auto again = run(dropped, in.q, in.k, in.v, in.dy, dtype);
    const auto other = run(dropped, in.q, in.k, in.v, in.dy, dtype);
    EXPECT_TRUE(torch::equal(first.y, again.y) && torch::equal(first.dq, again.dq) &&
                torch::equal(first.dk, again.dk) && torch::equal(first.dv, again.dv))
        << dtype;
    EXPECT_FALSE(torch::equal(first.y, other.y)) << dtype;
  }
}

TEST(CausalAttention, LongSequencesKeepNothingOfTheSquare) {
  // Forward keeps q, k and v for backward, not the (T, T) weights of each
  // head, and neither pass holds the heads' squares at once: at T = 4096
  // the two heads' squares are 128 MiB in fp32 (64 in bf16), the inputs
  // and output 1 MiB (512 KiB) each. Backward's scratch is three blocks
  // of rows per task running (64 x T floats; 256 x T bf16 through ATen).
  memory::count_cpu_allocations();
  const int64_t T = 4096, nh = 2, hs = 32;
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    torch::manual_seed(3);
    const auto leaf = [&] { return torch::randn({1, T, nh, hs}, dtype).requires_grad_(); };
    auto q = leaf(), k = leaf(), v = leaf();
    auto dy = torch::randn({1, T, nh * hs}, dtype);
    const int64_t io = q.numel() * q.element_size(), squares = nh * T * T * q.element_size();
    const int64_t before = memory::allocated_bytes();
    memory::reset_allocated_peak();
    auto y = causal_attention(q, k, v);
    EXPECT_LE(memory::allocated_bytes() - before, io) << dtype << ": forward kept more than its output";
    y.backward(dy);
    const int64_t peak = memory::peak_allocated_bytes() - before;
    EXPECT_LT(peak, squares / 4) << dtype << ": a pass held " << peak << " bytes";
    EXPECT_TRUE(torch::isfinite(q.grad()).all().item<bool>());
  }
}

TEST(CausalAttention, OtherDtypesTakeTheCompositePathWithTheSameLayout) {
  // Double is not fused: LibTorch's ops, same (B, T, nh * hs) result.
  const auto in = inputs(2, 21, 4, 2, 8);
  expect_close(run(attend, in.q, in.k, in.v, in.dy, torch::kDouble), exact(in), 1e-12);
}

TEST(CausalAttention, TheResultDoesNotDependOnTheThreadCount) {
  const auto in = inputs(3, 45, 6, 3, 16);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = run(attend, in.q, in.k, in.v, in.dy, torch::kFloat);
  at::set_num_threads(std::max(threads, 2));
  const auto many = run(attend, in.q, in.k, in.v, in.dy, torch::kFloat);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one.y, many.y));
  EXPECT_TRUE(torch::equal(one.dq, many.dq));
  EXPECT_TRUE(torch::equal(one.dk, many.dk));
  EXPECT_TRUE(torch::equal(one.dv, many.dv));
}

TEST(CausalAttention, TheFusedPathBuildsNoMaskAndCopiesNoHeads) {
  // The composite path's operators (mask, masked_fill, softmax, transposed
  // copies of q, k, v and y, concatenation of the packed gradient) must not
  // run on the fused path.
  const int64_t B = 2, T = 16, nh = 2, hs = 8;
  auto qkv = torch::randn({B, T, 3 * nh * hs}).requires_grad_();
  auto dy = torch::randn({B, T, nh * hs});
  const auto seen = testing::dispatched_operators([&] { causal_attention_packed(qkv, nh).backward(dy); });
  for (const char* op : {"aten::triu", "aten::masked_fill_", "aten::_softmax", "aten::_softmax_backward_data",
                         "aten::copy_", "aten::cat", "aten::bmm"}) {
    EXPECT_EQ(seen.count(op), 0u) << op << " ran";
  }
  EXPECT_GT(seen.size(), 0u) << "the counter sees operators";
}

// `multiply(trans_a, trans_b, m, n, k, a, b, beta, c)` sets c (float) to
// op(a) op(b) + beta c, row-major, with each transpose, rows `pad`
// elements wider than used, and with and without accumulation: against
// double on the same operands, and nothing written past a row.
template <typename Multiply>
void expect_row_major_products_match_double(torch::ScalarType operands, int64_t m, int64_t n, int64_t k, double rtol,
                                            Multiply multiply) {
  const int64_t pad = 3;
  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      for (const float beta : {0.0f, 1.0f}) {
        const auto a = torch::randn({trans_a ? k : m, (trans_a ? m : k) + pad}).to(operands);
        const auto b = torch::randn({trans_b ? n : k, (trans_b ? k : n) + pad}).to(operands);
        auto c = torch::randn({m, n + pad});
        const auto before = c.clone();
        multiply(trans_a, trans_b, m, n, k, a, b, beta, c);
        const auto a_used = a.narrow(1, 0, a.size(1) - pad).to(torch::kDouble);
        const auto b_used = b.narrow(1, 0, b.size(1) - pad).to(torch::kDouble);
        const auto expected = (trans_a ? a_used.t() : a_used).matmul(trans_b ? b_used.t() : b_used) +
                              beta * before.narrow(1, 0, n).to(torch::kDouble);
        const std::string which = std::string(trans_a ? "A^T" : "A") + (trans_b ? " B^T" : " B") +
                                  (beta != 0 ? " + C" : "");
        EXPECT_TRUE(torch::allclose(c.narrow(1, 0, n).to(torch::kDouble), expected, rtol, 1e-5)) << which;
        EXPECT_TRUE(torch::equal(c.narrow(1, n, pad), before.narrow(1, n, pad))) << which << ": wrote past a row";
      }
    }
  }
}

// The fp32 kernel's products: kernels::sgemm_rows, row-major through a
// column-major BLAS.
TEST(AttentionGemm, RowMajorProductsMatchDouble) {
  if (!kernels::sgemm_available()) GTEST_SKIP() << "this build links no sgemm_: attention multiplies through ATen";
  expect_row_major_products_match_double(
      torch::kFloat, 5, 7, 3, 1e-5,
      [](bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b, float beta,
         Tensor& c) {
        kernels::sgemm_rows(trans_a, trans_b, m, n, k, 1.0f, a.data_ptr<float>(), a.size(1), b.data_ptr<float>(),
                            b.size(1), beta, c.data_ptr<float>(), c.size(1));
      });
}

// MKL's bf16 products, as attention calls them: bf16 operands and a float
// result. Products of bf16 values are exact in float; the sum of 70 rounds.
TEST(AttentionGemm, Bf16ProductsIntoFloatMatchDouble) {
  if (!kernels::gemm_bf16_available()) GTEST_SKIP() << "this BLAS has no bf16 gemm: attention multiplies through ATen";
  const auto bits = [](const Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); };
  expect_row_major_products_match_double(
      torch::kBFloat16, 37, 29, 70, 1e-4,
      [&](bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b, float beta,
          Tensor& c) {
        kernels::gemm_bf16_rows(trans_a, trans_b, m, n, k, 1.0f, bits(a), a.size(1), bits(b), b.size(1), beta,
                                c.data_ptr<float>(), c.size(1));
      });
}

TEST(AttentionGemm, FloatToBf16RoundsToNearestEven) {
  // Random values, and ties: 1 + 2^-8 lies halfway between 1 and the next
  // bf16 up, 1 + 3 * 2^-8 halfway between that one and the next.
  const auto ties = torch::tensor({1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -1.0f - 0x1p-8f});
  const auto x = torch::cat({torch::randn({1000}) * 1000, ties});
  auto y = torch::empty({x.numel()}, torch::kBFloat16);
  kernels::float_to_bf16(x.data_ptr<float>(), reinterpret_cast<uint16_t*>(y.data_ptr()), x.numel());
  EXPECT_TRUE(torch::equal(y, x.to(torch::kBFloat16)));  // c10's rounding: nearest, ties to even
}

// Where the process exposes no sgemm_ (a static LibTorch, say) or no
// bf16 gemm (a BLAS other than MKL), the products go through ATen on
// tensors over the same heads: the same values.
TEST(CausalAttention, WithoutBlasTheProductsGoThroughATenToTheSameValues) {
  BlasHidden hidden;
  ASSERT_FALSE(kernels::sgemm_available());
  ASSERT_FALSE(kernels::gemm_bf16_available());
  for (int64_t T : {1, 37, 150}) {
    const auto in = inputs(2, T, 4, 2, 16);
    expect_close(run(attend, in.q, in.k, in.v, in.dy, torch::kFloat), exact(in), 5e-6);
  }
  expect_expanded_and_single_token_views_taken_as_their_values();
  expect_bf16_within_rounding();
}

TEST(CausalAttention, MismatchedHeadsAreRefusedByShape) {
  auto q = torch::randn({1, 4, 3, 8}), k = torch::randn({1, 4, 2, 8});
  try {
    causal_attention(q, k, k);
    FAIL() << "3 query heads over 2 key/value heads were accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of 2 key/value heads"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fsdp::models::attention_test
