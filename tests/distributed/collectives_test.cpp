// Collectives checked against values each rank computes locally for every
// rank's input (inputs are seeded by rank, so any rank can rebuild them).

#include "fsdp/distributed/collectives.h"

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "dist_test_world.h"
#include "distributed/shared_memory.h"
#include "fsdp/common/error.h"

namespace fsdp::dist::collectives_test {
namespace {

using fsdp::testing::test_world;

// Rank r's input for a test: deterministic in (r, n, salt).
at::Tensor input_of(int r, int64_t n, int salt, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * salt + r);
  return at::randn({n}, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
}

// Reference reduction, summed in fp32 as the library promises for half types.
at::Tensor reference_sum(int world, int64_t n, int salt, at::ScalarType dtype) {
  at::Tensor acc = at::zeros({n}, at::kFloat);
  for (int r = 0; r < world; ++r) acc += input_of(r, n, salt, dtype).to(at::kFloat);
  return acc;
}

// The largest relative error of this LibTorch's fp32 -> bf16 conversion,
// measured: half a unit in the last place (2^-9) where it rounds to nearest
// (LibTorch 2.x), a whole unit (2^-8) where it truncates (Debian's 1.13).
double bf16_conversion_error() {
  static const double error = [] {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    const at::Tensor x = at::randn({1 << 16}, gen) * 4;
    return ((x.to(at::kBFloat16).to(at::kFloat) - x).abs() / x.abs()).max().item<double>();
  }();
  return error;
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol) {
  if (actual.scalar_type() == at::kBFloat16) rtol = 1.001 * bf16_conversion_error() + 1e-6;
  ASSERT_EQ(actual.sizes(), expected.sizes());
  const at::Tensor a = actual.to(at::kDouble);
  const at::Tensor e = expected.to(at::kDouble);
  EXPECT_TRUE(at::allclose(a, e, rtol, atol)) << "max abs diff " << (a - e).abs().max().item<double>();
}

struct DtypeCase {
  at::ScalarType dtype;
  // Against the sum in fp32, unrounded. fp32: summation order; bf16: one
  // conversion of the fp32 sum (bf16_conversion_error()), which summing in
  // bf16 would exceed.
  double rtol;
  // Through host copies, as a device's tensors are where ranks share a GPU
  // ([Note: many ranks on one GPU]): the same results, written back to the
  // caller's tensors when waited for.
  bool staged = false;
};

class Collectives : public ::testing::TestWithParam<DtypeCase> {
 protected:
  void SetUp() override { test_world().group().stage_host_tensors = GetParam().staged; }
  void TearDown() override { test_world().group().stage_host_tensors = false; }
};

TEST_P(Collectives, AllGatherIntoTensor) {
  auto& g = test_world().group();
  const auto dtype = GetParam().dtype;
  for (int64_t n : {1, 7, 4096}) {
    at::Tensor out = at::empty({n * g.size()}, dtype);
    all_gather_into_tensor(g, out, input_of(g.rank(), n, 1, dtype)).wait();
    std::vector<at::Tensor> parts;
    for (int r = 0; r < g.size(); ++r) parts.push_back(input_of(r, n, 1, dtype));
    EXPECT_TRUE(out.equal(at::cat(parts))) << "n=" << n;  // gathering moves bits: exact
  }
}

TEST_P(Collectives, ReduceScatterSumAndAvg) {
  auto& g = test_world().group();
  const auto [dtype, rtol, staged] = GetParam();
  const int w = g.size();
  for (int64_t n : {1, 5, 3000}) {
    const at::Tensor full = reference_sum(w, n * w, 2, dtype);
    const at::Tensor mine = full.narrow(0, g.rank() * n, n);
    at::Tensor out = at::empty({n}, dtype);
    reduce_scatter_tensor(g, out, input_of(g.rank(), n * w, 2, dtype), ReduceOp::kSum).wait();
    expect_close(out, mine, rtol, 1e-6);
    reduce_scatter_tensor(g, out, input_of(g.rank(), n * w, 2, dtype), ReduceOp::kAvg).wait();
    expect_close(out, mine / w, rtol, 1e-6);
  }
}

TEST_P(Collectives, UnevenSizeRoundTripsThroughPadding) {
  // 10 elements do not divide by 3 or 4: pad, reduce-scatter, gather, trim.
  auto& g = test_world().group();
  const auto [dtype, rtol, staged] = GetParam();
  const int w = g.size();
  const int64_t numel = 10;
  const int64_t shard = shard_numel(numel, w);
  ASSERT_EQ(padded_numel(numel, w), shard * w);
  ASSERT_GE(shard * w, numel);
  at::Tensor padded = at::zeros({shard * w}, dtype);
  padded.narrow(0, 0, numel).copy_(input_of(g.rank(), numel, 3, dtype));
  at::Tensor my_shard = at::empty({shard}, dtype);
  reduce_scatter_tensor(g, my_shard, padded).wait();
  at::Tensor gathered = at::empty({shard * w}, dtype);
  all_gather_into_tensor(g, gathered, my_shard).wait();
  expect_close(gathered.narrow(0, 0, numel), reference_sum(w, numel, 3, dtype), rtol, 1e-6);
  EXPECT_TRUE(gathered.narrow(0, numel, shard * w - numel).eq(0).all().item<bool>()) << "padding stays zero";
}

TEST_P(Collectives, AllReduceSumAvgMax) {
  auto& g = test_world().group();
  const auto [dtype, rtol, staged] = GetParam();
  const int w = g.size();
  const int64_t n = 1001;
  at::Tensor t = input_of(g.rank(), n, 4, dtype);
  all_reduce(g, t, ReduceOp::kSum).wait();
  expect_close(t, reference_sum(w, n, 4, dtype), rtol, 1e-6);

  t = input_of(g.rank(), n, 4, dtype);
  all_reduce(g, t, ReduceOp::kAvg).wait();
  expect_close(t, reference_sum(w, n, 4, dtype) / w, rtol, 1e-6);

  t = input_of(g.rank(), n, 4, dtype);
  all_reduce(g, t, ReduceOp::kMax).wait();
  at::Tensor expected = input_of(0, n, 4, dtype);
  for (int r = 1; r < w; ++r) expected = at::maximum(expected, input_of(r, n, 4, dtype));
  EXPECT_TRUE(t.equal(expected));
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  auto& g = test_world().group();
  const auto dtype = GetParam().dtype;
  for (int root = 0; root < g.size(); ++root) {
    at::Tensor t = g.rank() == root ? input_of(root, 333, 5, dtype) : at::zeros({333}, dtype);
    broadcast(g, t, root).wait();
    EXPECT_TRUE(t.equal(input_of(root, 333, 5, dtype))) << "root " << root;
  }
}

TEST_P(Collectives, ManyInFlightWaitedOutOfOrder) {
  auto& g = test_world().group();
  const auto [dtype, rtol, staged] = GetParam();
  const int w = g.size();
  std::vector<at::Tensor> outs;
  std::vector<Work> works;
  for (int i = 0; i < 4; ++i) {
    outs.push_back(at::empty({64}, dtype));
    works.push_back(reduce_scatter_tensor(g, outs.back(), input_of(g.rank(), 64 * w, 10 + i, dtype)));
  }
  for (int i = 3; i >= 0; --i) works[static_cast<size_t>(i)].wait();
  for (int i = 0; i < 4; ++i) {
    expect_close(outs[static_cast<size_t>(i)],
                 reference_sum(w, 64 * w, 10 + i, dtype).narrow(0, g.rank() * 64, 64), rtol, 1e-6);
  }
}

// Messages larger than one round of the shared-memory transport (2 MiB a
// member; [Note: shared-memory collectives]) move in several rounds, each
// a separate exchange between the members: every element lands once, in
// its place.
TEST_P(Collectives, MessagesLargerThanOneRound) {
  auto& g = test_world().group();
  const auto [dtype, rtol, staged] = GetParam();
  const int w = g.size();
  const int64_t n = 1200007;  // 2.4 MB in bf16, 4.8 MB in fp32: two rounds or more, the last one partial

  at::Tensor gathered = at::empty({n * w}, dtype);
  all_gather_into_tensor(g, gathered, input_of(g.rank(), n, 20, dtype)).wait();
  for (int r = 0; r < w; ++r) EXPECT_TRUE(gathered.narrow(0, r * n, n).equal(input_of(r, n, 20, dtype))) << r;

  const int64_t m = 700001;  // each round carries 1/W of a member's buffer for each destination
  at::Tensor mine = at::empty({m}, dtype);
  reduce_scatter_tensor(g, mine, input_of(g.rank(), m * w, 21, dtype)).wait();
  expect_close(mine, reference_sum(w, m * w, 21, dtype).narrow(0, g.rank() * m, m), rtol, 1e-6);

  at::Tensor t = input_of(g.rank(), n, 22, dtype);
  all_reduce(g, t, ReduceOp::kAvg).wait();
  expect_close(t, reference_sum(w, n, 22, dtype) / w, rtol, 1e-6);

  const int root = w - 1;
  at::Tensor b = g.rank() == root ? input_of(root, n, 23, dtype) : at::zeros({n}, dtype);
  broadcast(g, b, root).wait();
  EXPECT_TRUE(b.equal(input_of(root, n, 23, dtype)));
}

// bf16's rtol 0: measured, bf16_conversion_error().
INSTANTIATE_TEST_SUITE_P(Dtypes, Collectives,
                         ::testing::Values(DtypeCase{at::kFloat, 1e-5}, DtypeCase{at::kBFloat16, 0},
                                           DtypeCase{at::kFloat, 1e-5, true}, DtypeCase{at::kBFloat16, 0, true}),
                         [](const auto& info) {
                           return std::string(c10::toString(info.param.dtype)) + (info.param.staged ? "_staged" : "");
                         });

// Integer reductions are exact: each rank contributes rank + 1 at every
// position, so the sum is W(W+1)/2 and the max W.
TEST(CollectivesIntegers, AllReduceSumAndMaxAreExact) {
  auto& g = test_world().group();
  const int w = g.size();
  for (const auto dtype : {at::kLong, at::kInt, at::kByte}) {
    at::Tensor sum = at::full({5000}, g.rank() + 1, dtype);
    all_reduce(g, sum, ReduceOp::kSum).wait();
    EXPECT_TRUE(sum.eq(w * (w + 1) / 2).all().item<bool>()) << dtype;
    at::Tensor max = at::full({5000}, g.rank() + 1, dtype);
    all_reduce(g, max, ReduceOp::kMax).wait();
    EXPECT_TRUE(max.eq(w).all().item<bool>()) << dtype;
  }
}

// Ranks launched together on one host reach each other through shared
// memory, unless FSDP_SHARED_MEMORY=0 keeps Gloo's TCP; a group of one
// needs no transport of its own.
TEST(CollectivesTransport, RanksOnOneHostUseSharedMemory) {
  auto& g = test_world().group();
  const char* setting = std::getenv("FSDP_SHARED_MEMORY");
  const bool wanted = setting == nullptr || std::string(setting) != "0";
  EXPECT_STREQ(g.transport(), g.size() > 1 && wanted ? "shared memory" : "gloo") << g.describe();
  if (!g.shared_memory) return;
  // And the collectives go through it: each moves its rounds there.
  const uint32_t before = g.shared_memory->rounds();
  at::Tensor t = at::ones({10});
  all_reduce(g, t).wait();
  at::Tensor gathered = at::empty({10 * g.size()});
  all_gather_into_tensor(g, gathered, t).wait();
  EXPECT_EQ(g.shared_memory->rounds() - before, 2u);
}

TEST(CollectivesInput, WrongSizesAreRejectedBeforeAnyTraffic) {
  auto& g = test_world().group();
  at::Tensor out = at::empty({g.size() * 4 + 1});
  EXPECT_THROW(all_gather_into_tensor(g, out, at::zeros({4})), Error);
  EXPECT_THROW(reduce_scatter_tensor(g, at::empty({4}), at::zeros({g.size() * 4 + 1})), Error);
  EXPECT_THROW(all_reduce(g, at::zeros({4}, at::kInt), ReduceOp::kAvg), Error);
  EXPECT_THROW(broadcast(g, at::zeros({4}), g.size()), Error);
}

// No rank leaves the barrier before the last one has arrived: each rank
// arrives later than the one before (rank r after r x 150 ms), and each
// records when it left; the earliest to leave did so after the last arrival.
TEST(CollectivesBarrier, NoRankLeavesBeforeTheLastArrives) {
  auto& group = test_world().group();
  const int rank = test_world().rank(), world = test_world().size();
  barrier(group);  // start together
  using Clock = std::chrono::system_clock;
  const auto us = [] {
    return static_cast<double>(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count());
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(150 * rank));
  const double arrived = us();
  barrier(group);
  const double left = us();
  auto last_arrival = at::full({1}, arrived, at::kDouble);
  auto first_departure = at::full({1}, -left, at::kDouble);  // the max of -t is the min of t
  all_reduce(group, last_arrival, ReduceOp::kMax).wait();
  all_reduce(group, first_departure, ReduceOp::kMax).wait();
  const double earliest_left = -first_departure.item<double>();
  EXPECT_GE(earliest_left, last_arrival.item<double>())
      << "a rank left the barrier " << (last_arrival.item<double>() - earliest_left) / 1000 << " ms before rank "
      << world - 1 << " arrived";
}

}  // namespace
}  // namespace fsdp::dist::collectives_test
