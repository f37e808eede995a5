// Per-parameter placements (FullyShardOptions::shard_placement, FSDP2's
// shard_placement_fn): matrices on Shard(1) and norms on Shard(0) beside
// parameters left in the flat layout, and stacked experts on Shard(0).
// Each trains against one process on the same global batch, and each rank
// holds exactly the chunk torch.chunk gives it.

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>

#include "../distributed/dist_test_world.h"
#include "adapter_net.h"
#include "core/fsdp_state.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp_test_support.h"

namespace fsdp::testing::shard_placement_test {
namespace {

constexpr int64_t kDim = 23;  // divides by none of 2, 3, 4: every chunking is uneven
constexpr int64_t kRowsPerRank = 3;
constexpr double kTolerance = 1e-5;

torch::Tensor inputs_of(int step, int micro, int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 * step + micro + 5);
  return torch::randn({rows, kDim}, gen);
}
torch::Tensor targets_of(int step, int micro, int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(700 * step + micro + 13);
  return torch::randn({rows, 2}, gen);
}
int64_t global_rows() { return kRowsPerRank * test_world().size(); }
torch::Tensor local_rows(const torch::Tensor& t) {
  return t.narrow(0, test_world().rank() * kRowsPerRank, kRowsPerRank);
}

// Experts stacked in one parameter (E, D, D) beside a router and a head:
// under Shard(0) each rank holds whole experts.
struct ExpertNetImpl : torch::nn::Module {
  static constexpr int64_t kExperts = 5;
  ExpertNetImpl()
      : router(register_module("router", torch::nn::Linear(kDim, kExperts))),
        head(register_module("head", torch::nn::Linear(kDim, 2))) {
    experts = register_parameter("experts", torch::randn({kExperts, kDim, kDim}) * 0.2);
  }
  torch::Tensor forward(torch::Tensor x) {  // (B, D) -> (B, 2)
    const torch::Tensor weights = torch::softmax(router(x), -1);                     // (B, E)
    const torch::Tensor outs = torch::tanh(torch::einsum("bd,edf->bef", {x, experts}));  // (B, E, D)
    return head((outs * weights.unsqueeze(-1)).sum(1));
  }
  torch::nn::Linear router, head;
  torch::Tensor experts;
};
TORCH_MODULE(ExpertNet);

ExpertNet make_expert_net() {
  torch::manual_seed(kInitSeed);
  return ExpertNet();
}

AdapterNet make_net() {
  AdapterNetConfig c;
  c.dim = kDim;
  c.adapters = true;  // lora_b (23 x 3) on Shard(1): 3 columns, so some ranks hold none at W = 4
  return make_adapter_net(c, kInitSeed);
}

// Matrices on Shard(1), norms on Shard(0), everything else (biases) left flat.
std::optional<Shard> by_kind(const std::string& fqn, const at::Tensor& p) {
  if (p.dim() == 2) return Shard{1};
  if (fqn.find("norm") != std::string::npos) return Shard{0};
  return std::nullopt;
}

// `micro` micro-steps per step, AdamW(1e-2, weight decay 0.1); `sharded`
// feeds this rank's rows and returns the gathered full parameters.
template <typename Net>
NamedTensors train(Net& net, bool sharded, int steps, int micro, const std::function<void(Net&)>& before_step = {}) {
  torch::optim::AdamW optimizer(unique_parameters(*net), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int step = 0; step < steps; ++step) {
    for (int m = 0; m < micro; ++m) {
      torch::Tensor x = inputs_of(step, m, global_rows());
      torch::Tensor y = targets_of(step, m, global_rows());
      if (sharded) {
        x = local_rows(x);
        y = local_rows(y);
      }
      torch::Tensor out = sharded ? fsdp::call(net, x) : net->forward(x);
      (torch::mse_loss(out, y) / micro).backward();
    }
    if (before_step) before_step(net);
    optimizer.step();
    optimizer.zero_grad();
  }
  NamedTensors out;
  if (sharded) {
    for (const auto& [name, p] : full_parameters(*net)) out.emplace_back(name, p);
  } else {
    for (const auto& item : net->named_parameters()) out.emplace_back(item.key(), item.value().detach().clone());
  }
  return out;
}

// The shape torch.chunk gives rank `rank` of `ranks` along `dim`.
std::vector<int64_t> chunk_of(std::vector<int64_t> shape, int64_t dim, int rank, int ranks) {
  const int64_t chunk = (shape[dim] + ranks - 1) / ranks;
  shape[dim] = std::clamp<int64_t>(shape[dim] - rank * chunk, 0, chunk);
  return shape;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t s : shape) n *= s;
  return n;
}

// The unit a parameter of the adapter net belongs to: its block (b0, b1,
// ...), or the root.
std::string unit_of(const std::string& fqn) {
  return fqn[0] == 'b' && std::isdigit(static_cast<unsigned char>(fqn[1])) != 0 ? fqn.substr(0, fqn.find('.'))
                                                                                 : "<root>";
}

class ShardPlacement : public ::testing::TestWithParam<ShardingStrategy> {};

TEST_P(ShardPlacement, MatricesOnShard1AndNormsOnShard0TrainAsOneProcessHoldingTheirChunks) {
  const ShardingStrategy strategy = GetParam();
  if (strategy == ShardingStrategy::kHybridShard && hybrid_fsdp_size(test_world().size()) == 0) GTEST_SKIP();
  const auto full_shapes = parameter_shapes(*make_net());
  auto net = make_net();
  FullyShardOptions options;
  options.mesh = mesh_for(strategy);
  options.strategy = strategy;
  options.shard_placement = by_kind;
  for (auto& b : net->blocks) fully_shard(b, options);
  fully_shard(net, options);
  const dist::ProcessGroup& group = detail::state_of(*net)->group()->shard_group();
  const int ranks = group.size();
  const int rank = group.rank();

  // The bytes each rank holds: every placed parameter's padded chunk, and
  // each unit's flat parameters end to end, padded to a multiple of W.
  std::map<std::string, int64_t> flat_numel;
  int64_t placed_numel = 0;
  std::map<std::string, std::vector<int64_t>> expected_shape;
  for (const auto& [fqn, shape] : full_shapes) {
    const auto placement = by_kind(fqn, torch::empty(shape));
    if (!placement) {
      flat_numel[unit_of(fqn)] += numel_of(shape);
      expected_shape[fqn] = {-1};
      continue;
    }
    auto padded = shape;
    padded[placement->dim] = (shape[placement->dim] + ranks - 1) / ranks;
    placed_numel += numel_of(padded);
    expected_shape[fqn] = chunk_of(shape, placement->dim, rank, ranks);
  }
  int64_t expected_numel = placed_numel;
  for (const auto& [unit, numel] : flat_numel) expected_numel += (numel + ranks - 1) / ranks;
  EXPECT_EQ(sharded_param_bytes(*net), expected_numel * 4);

  const auto expect_chunks = [&](AdapterNet& n) {
    for (const auto& [fqn, p] : unique_named_parameters(*n)) {
      const auto& want = expected_shape.at(fqn);
      if (want == std::vector<int64_t>{-1}) {
        EXPECT_EQ(p.dim(), 1) << fqn << ": a flat parameter's shard is a 1-D slice";
        continue;
      }
      EXPECT_EQ(p.sizes().vec(), want) << fqn;
      if (p.grad().defined()) {
        EXPECT_EQ(p.grad().sizes().vec(), want) << fqn << "'s gradient";
      }
    }
  };
  expect_chunks(net);
  const NamedTensors sharded = train<AdapterNet>(net, true, 3, 2, expect_chunks);
  auto plain_net = make_net();
  const NamedTensors plain = train<AdapterNet>(plain_net, false, 3, 2);
  std::string worst;
  EXPECT_LE(max_relative_difference(sharded, plain, &worst), kTolerance) << "worst parameter: " << worst;
  auto initial = make_net();
  EXPECT_GT(max_relative_difference(plain, train<AdapterNet>(initial, false, 0, 1), nullptr), 1e-3)
      << "training changed nothing";
}

INSTANTIATE_TEST_SUITE_P(Strategies, ShardPlacement,
                         ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard),
                         [](const ::testing::TestParamInfo<ShardingStrategy>& info) { return to_string(info.param); });

TEST(ShardPlacementExperts, EachRankHoldsWholeExpertsAndTrainsAsOneProcess) {
  const ExpertNet reference = make_expert_net();
  const at::Tensor experts = reference->experts.detach().clone();
  auto net = make_expert_net();
  FullyShardOptions options;
  options.mesh = mesh_for(ShardingStrategy::kFullShard);
  options.shard_placement = [](const std::string& fqn, const at::Tensor&) -> std::optional<Shard> {
    if (fqn == "experts") return Shard{0};
    return std::nullopt;
  };
  fully_shard(net, options);
  const int ranks = test_world().size();
  const int rank = test_world().rank();
  const int64_t chunk = (ExpertNetImpl::kExperts + ranks - 1) / ranks;
  const auto held = chunk_of(experts.sizes().vec(), 0, rank, ranks);
  // Whole experts, the rank's own, bit for bit.
  ASSERT_EQ(net->experts.sizes().vec(), held);
  if (held[0] > 0) {
    EXPECT_TRUE(torch::equal(net->experts.detach(), experts.narrow(0, rank * chunk, held[0])));
  }
  // What a checkpoint stores: one range of the flattened parameter.
  for (const auto& s : local_shards(*net)) {
    if (s.fqn != "experts") continue;
    EXPECT_EQ(s.begin, held[0] > 0 ? rank * chunk * kDim * kDim : 0);
    EXPECT_EQ(s.numel, numel_of(held));
    EXPECT_TRUE(torch::equal(s.local, experts.reshape({-1}).narrow(0, s.begin, s.numel)));
  }
  const NamedTensors sharded = train<ExpertNet>(net, true, 3, 1);
  auto plain_net = make_expert_net();
  const NamedTensors plain = train<ExpertNet>(plain_net, false, 3, 1);
  std::string worst;
  EXPECT_LE(max_relative_difference(sharded, plain, &worst), kTolerance) << "worst parameter: " << worst;
  for (const auto& [name, trained] : plain) {
    if (name != "experts") continue;
    EXPECT_GT((trained - experts).abs().max().item<double>(), 1e-3) << "training changed nothing";
  }
}

// Matrices on Shard(1) hold columns, not ranges: a save is refused on
// every rank alike (at W = 4 lora_b's 3 columns leave the last rank none,
// whose own part is an empty range: it must refuse too, or the others
// would wait for it in the save's collectives), and nothing is written.
TEST(ShardPlacementCheckpoint, ChunksThatAreNotRangesAreRefusedOnEveryRankBeforeAnythingIsWritten) {
  if (test_world().size() == 1) GTEST_SKIP() << "one rank holds every matrix whole: one range";
  auto net = make_net();
  FullyShardOptions options;
  options.mesh = mesh_for(ShardingStrategy::kFullShard);
  options.shard_placement = by_kind;
  for (auto& b : net->blocks) fully_shard(b, options);
  fully_shard(net, options);
  torch::optim::AdamW optimizer(unique_parameters(*net));
  const std::string dir = std::filesystem::temp_directory_path().string() + "/fsdp-placed-save-" +
                          std::to_string(test_world().size()) + "-" + std::getenv("MASTER_PORT");
  std::filesystem::remove_all(dir);
  dist::barrier(test_world().group());
  expect_error_on_every_rank([&] { checkpoint::save(dir, 1, *net, optimizer, {}, test_world()); },
                             {"Shard(1)", "place it on Shard(0)"});
  EXPECT_FALSE(std::filesystem::exists(dir)) << "a refused save wrote into " << dir;
}

TEST(ShardPlacementRefused, ADimOutsideTheParameterIsNamedAndNothingIsSharded) {
  auto net = make_expert_net();
  FullyShardOptions options;
  options.mesh = mesh_for(ShardingStrategy::kFullShard);
  options.shard_placement = [](const std::string&, const at::Tensor& p) -> std::optional<Shard> {
    return p.dim() == 2 ? std::optional<Shard>(Shard{2}) : std::nullopt;
  };
  expect_error_on_every_rank([&] { fully_shard(net, options); },
                             {"'router.weight'", "Shard(2)", "expected a dim in [-2, 2)"});
  EXPECT_EQ(net->router->weight.sizes().vec(), (std::vector<int64_t>{ExpertNetImpl::kExperts, kDim}));
  EXPECT_EQ(detail::state_of(*net), nullptr);
}

}  // namespace
}  // namespace fsdp::testing::shard_placement_test
