// fully_shard beyond equivalence: bad input, memory, initialisation,
// ignored parameters, fp16 loss scaling, and sharded modules called as
// modules (FSDP_MODULE) or, wrongly, around their hooks.

#include <malloc.h>

#include <chrono>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "../distributed/dist_test_world.h"
#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/core/grad_scaler.h"
#include "fsdp/core/memory.h"
#include "fsdp/core/replicate.h"
#include "fsdp/core/module_holder.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp_test_support.h"

namespace fsdp::testing::fully_shard_test {
namespace {

std::shared_ptr<dist::DeviceMesh> world_mesh() {
  static auto mesh = std::make_shared<dist::DeviceMesh>(make_mesh(test_world_ptr(), ShardingStrategy::kFullShard));
  return mesh;
}

FullyShardOptions default_options() {
  FullyShardOptions o;
  o.mesh = world_mesh();
  return o;
}

// A module that registers the tensor it is given, to share one parameter.
struct HolderImpl : torch::nn::Module {
  explicit HolderImpl(torch::Tensor t) { w = register_parameter("w", t); }
  torch::Tensor forward(torch::Tensor x) { return x * w; }
  torch::Tensor w;
};
TORCH_MODULE(Holder);

TEST(FullyShardErrors, ShardingTwice) {
  auto model = make_tiny(tiny_config(), kInitSeed);
  fully_shard(model->blocks[0], default_options());
  expect_error_on_every_rank([&] { fully_shard(model->blocks[0], default_options()); },
                             {"sharded already", "ln_1.weight", "once per module"});
}

// The root sharded before its blocks: a block's parameters are the root
// unit's already, and the message gives the order (children first).
TEST(FullyShardErrors, AnAncestorShardedBeforeItsBlocks) {
  auto model = make_tiny(tiny_config(), kInitSeed);
  fully_shard(model, default_options());
  expect_error_on_every_rank([&] { fully_shard(model->blocks[0], default_options()); },
                             {"every parameter of module", "ancestor was sharded first", "children before parents"});
}

TEST(FullyShardErrors, TorchSaveAndLoadOfAShardedModuleAreRefusedNamingTheStateDicts) {
  const std::string dir = std::filesystem::temp_directory_path().string() + "/fsdp-torch-save-" +
                          std::to_string(test_world().rank()) + "-" + std::getenv("MASTER_PORT");
  std::filesystem::create_directories(dir);
  auto plain = make_tiny(tiny_config(), kInitSeed);
  torch::save(plain, dir + "/plain.pt");
  auto model = make_tiny(tiny_config(), kInitSeed);
  for (auto& block : model->blocks) fully_shard(block, default_options());
  fully_shard(model, default_options());
  expect_error_on_every_rank([&] { torch::save(model, dir + "/sharded.pt"); },
                             {"torch::save / torch::load:", "sharded by fully_shard", "save_full_state_dict"});
  EXPECT_FALSE(std::filesystem::exists(dir + "/sharded.pt")) << "a refused save wrote the file";
  const auto before = full_parameters(*model);
  expect_error_on_every_rank([&] { torch::load(model, dir + "/plain.pt"); },
                             {"torch::save / torch::load:", "sharded by fully_shard", "load_full_state_dict"});
  const auto after = full_parameters(*model);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(torch::equal(after[i].second, before[i].second)) << after[i].first;
  // A replicated module is whole on every rank: saved and loaded as if never replicated.
  auto replicated = make_tiny(tiny_config(), kInitSeed);
  replicate(replicated, ReplicateOptions{test_world_ptr()});
  torch::save(replicated, dir + "/replicated.pt");
  auto loaded = make_tiny(tiny_config(), kInitSeed + 1);
  torch::load(loaded, dir + "/replicated.pt");
  for (const auto& item : replicated->named_parameters()) {
    EXPECT_TRUE(torch::equal(loaded->named_parameters()[item.key()], item.value())) << item.key();
  }
  std::filesystem::remove_all(dir);
}

TEST(FullyShardErrors, ParameterSharedBetweenTwoUnits) {
  struct PairImpl : torch::nn::Module {
    PairImpl() {
      auto shared = torch::randn({4});
      a = register_module("a", Holder(shared));
      b = register_module("b", Holder(shared));
    }
    Holder a{nullptr}, b{nullptr};
  };
  auto pair = std::make_shared<PairImpl>();
  fully_shard(pair->a, default_options());
  expect_error_on_every_rank([&] { fully_shard(pair->b, default_options()); },
                             {"parameter 'w' is shared with another unit", "common ancestor"});
  // a holds it already, so the parent cannot take b's name for it either.
  expect_error_on_every_rank([&] { fully_shard(*pair, default_options()); }, {"'b.w' is shared", "'a.w'"});
}

TEST(FullyShardOwnership, StateAndShardsGoWithTheModule) {
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> root_shard, block_shard;
  {
    auto model = make_tiny(tiny_config(), kInitSeed);
    for (auto& block : model->blocks) fully_shard(block, default_options());
    fully_shard(model, default_options());
    EXPECT_TRUE(is_fully_sharded(*model));
    EXPECT_TRUE(is_fully_sharded(*model->blocks[0]));
    root_shard = model->wte->weight.storage().getWeakStorageImpl();
    block_shard = model->blocks[0]->ln_1->weight.storage().getWeakStorageImpl();
    EXPECT_FALSE(root_shard->expired());
  }
  // Nothing else keeps a unit's master shard alive once its module is gone.
  EXPECT_TRUE(root_shard->expired());
  EXPECT_TRUE(block_shard->expired());
  // A new model (likely at the same addresses) starts unsharded.
  auto fresh = make_tiny(tiny_config(), kInitSeed);
  EXPECT_FALSE(is_fully_sharded(*fresh));
  EXPECT_FALSE(is_fully_sharded(*fresh->blocks[0]));
  for (auto& block : fresh->blocks) fully_shard(block, default_options());
  fully_shard(fresh, default_options());
  EXPECT_TRUE(is_fully_sharded(*fresh));
}

TEST(FullyShardOwnership, BlockOutlivingItsRootStillRuns) {
  auto model = make_tiny(tiny_config(), kInitSeed);
  auto block = model->blocks[0];
  const auto x = torch::randn({2, 4, tiny_config().dim});
  const auto expected = block->forward(x);  // before sharding
  for (auto& b : model->blocks) fully_shard(b, default_options());
  fully_shard(model, default_options());
  model = nullptr;  // the root's state goes; the block becomes a root of its own
  EXPECT_TRUE(is_fully_sharded(*block));
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(call(block, x), expected, 1e-5, 1e-6));
}

TEST(FullyShardMixedDtypes, EachDtypeShardedAndGatheredInItsOwnOrThePolicysDtype) {
  struct MixedImpl : torch::nn::Module {
    MixedImpl() {
      register_parameter("single", torch::randn({5}));
      register_parameter("double_precision", torch::randn({3, 3}, torch::kDouble));
      register_parameter("single_too", torch::randn({2}));
    }
  };
  const int64_t w = test_world().size();
  for (const bool policy : {false, true}) {
    torch::manual_seed(3);
    auto mixed = std::make_shared<MixedImpl>();
    std::vector<std::pair<std::string, torch::Tensor>> expected;
    for (const auto& item : mixed->named_parameters()) expected.emplace_back(item.key(), item.value().detach().clone());
    auto options = default_options();
    if (policy) options.mixed_precision.param_dtype = torch::kBFloat16;
    fully_shard(*mixed, options);
    // Each dtype padded to a multiple of W on its own: 7 fp32 and 9 fp64 elements.
    const int64_t shard_fp32 = (7 + w - 1) / w, shard_fp64 = (9 + w - 1) / w;
    EXPECT_EQ(sharded_param_bytes(*mixed), shard_fp32 * 4 + shard_fp64 * 8);
    for (const auto& item : mixed->named_parameters()) {
      const auto& original = std::find_if(expected.begin(), expected.end(), [&](const auto& e) {
                               return e.first == item.key();
                             })->second;
      EXPECT_EQ(item.value().scalar_type(), original.scalar_type()) << item.key() << " sharded";
    }
    unshard(*mixed);
    for (const auto& [name, original] : expected) {
      const torch::Tensor gathered = mixed->named_parameters()[name];
      const auto dtype = policy ? torch::kBFloat16 : original.scalar_type();
      EXPECT_EQ(gathered.scalar_type(), dtype) << name << " gathered";
      EXPECT_TRUE(torch::equal(gathered, original.to(dtype))) << name;
    }
    reshard(*mixed);
    EXPECT_EQ(memory::gathered_bytes(), 0);
    const auto full = full_parameters(*mixed);
    ASSERT_EQ(full.size(), expected.size());
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_EQ(full[i].first, expected[i].first);
      EXPECT_TRUE(torch::equal(full[i].second, expected[i].second)) << full[i].first << " not returned as it was";
    }
    // Converting the unit is refused whichever dtype is named: some parameter would change.
    expect_error_on_every_rank([&] { mixed->to(torch::kDouble); }, {"sharded by fully_shard"});
  }
}

TEST(FullyShardErrors, NoShardNeedsAReplicateMesh) {
  if (test_world().size() == 1) GTEST_SKIP() << "at W=1 every mesh has shard size 1";
  auto model = make_tiny(tiny_config(), kInitSeed);
  auto options = default_options();
  options.strategy = ShardingStrategy::kNoShard;
  expect_error_on_every_rank([&] { fully_shard(model, options); }, {"no_shard", "shard size 1"});
}

TEST(FullyShardErrors, HybridShardSizeMustDivideTheWorld) {
  const int w = test_world().size();
  expect_error_on_every_rank([&] { make_mesh(test_world_ptr(), ShardingStrategy::kHybridShard, w + 1); },
                             {"does not divide WORLD_SIZE " + std::to_string(w)});
}

TEST(FullyShardErrors, UnknownStrategyName) {
  EXPECT_THROW(parse_sharding_strategy("zero3"), Error);
  EXPECT_EQ(parse_sharding_strategy("HYBRID_SHARD"), ShardingStrategy::kHybridShard);
}

TEST(FullyShardParams, UnitSizesAreNotMultiplesOfThreeOrFour) {
  // So that W = 3 and W = 4 pad every unit's flat buffer.
  auto model = make_tiny(tiny_config(), kInitSeed);
  int64_t block = 0;
  for (const auto& p : model->blocks[0]->parameters()) block += p.numel();
  int64_t all = 0;
  for (const auto& p : unique_parameters(*model)) all += p.numel();
  const int64_t root = all - block * tiny_config().layers;
  for (int w : {3, 4}) {
    EXPECT_NE(block % w, 0) << "block of " << block;
    EXPECT_NE(root % w, 0) << "root of " << root;
  }
}

int64_t full_param_count() {
  int64_t n = 0;
  for (const auto& p : unique_parameters(*make_tiny(tiny_config(), kInitSeed))) n += p.numel();
  return n;
}

TEST(FullyShardMemory, ShardedStateIsAWthOfTheFullStatePlusPadding) {
  const int w = test_world().size();
  ShardedRunLog log;
  RunSpec spec;
  spec.steps = 1;
  train_sharded(spec, &log);
  // params + grads + AdamW's two moments, fp32, for the whole model:
  const int64_t full_state = 4 * 4 * full_param_count();
  const int64_t units = tiny_config().layers + 1;
  const int64_t padding = 4 * 4 * units;  // at most one padded element per unit per shard copy
  EXPECT_LE(log.state_bytes_after_first_step, full_state / w + padding)
      << "full state " << full_state << " bytes over " << w << " ranks";
  EXPECT_GE(log.state_bytes_after_first_step, full_state / w - padding) << "the state must be there";
}

int64_t heap_bytes() {
  // Gloo's worker thread drops its reference to a finished collective (and
  // the buffers it holds) just after the wait returns: the least of a few
  // samples a few milliseconds apart is what the step itself keeps.
  int64_t least = std::numeric_limits<int64_t>::max();
  for (int i = 0; i < 4; ++i) {
    const struct mallinfo2 m = mallinfo2();
    // Large blocks come from fsdp's CPU block cache, not the heap.
    least = std::min(least, static_cast<int64_t>(m.uordblks + m.hblkhd) + memory::large_cpu_bytes_in_use());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return least;
}

TEST(FullyShardMemory, HeldMemoryDoesNotGrowAcrossSteps) {
  auto model = make_tiny(TinyConfig{64, 8, 64, 4, 3}, kInitSeed);
  for (auto& block : model->blocks) fully_shard(block, default_options());
  fully_shard(model, default_options());
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  int64_t model_bytes = 0;
  for (const auto& p : unique_parameters(*make_tiny(TinyConfig{64, 8, 64, 4, 3}, 1))) model_bytes += p.nbytes();
  std::vector<int64_t> held;
  memory::reset_peak();
  for (int step = 0; step < 8; ++step) {
    auto tokens = global_batch(step, 2).remainder(64);
    torch::Tensor logits = fsdp::call(model, tokens.narrow(1, 0, 8));
    torch::nn::functional::cross_entropy(logits.reshape({-1, 64}), tokens.narrow(1, 1, 8).reshape({-1})).backward();
    optimizer.step();
    optimizer.zero_grad();
    EXPECT_EQ(memory::gathered_bytes(), 0) << "gathered buffers left after step " << step;
    held.push_back(heap_bytes());
  }
  // From step 2 on, nothing new is kept: growth stays well below one gathered model per step.
  EXPECT_LT(held.back() - held[2], model_bytes / 4) << "heap after step 2: " << held[2] << ", after step 8: " << held.back();
  // FULL_SHARD holds at most the root, the running block and one prefetched block gathered.
  if (test_world().size() > 1) {
    EXPECT_LT(memory::peak_gathered_bytes(), model_bytes);
  }
}

TEST(FullyShardInit, MetaParametersAreMaterialisedOneAtATime) {
  // Six deferred 512 KiB parameters: a rank must never hold more
  // than its shards so far plus the one parameter being initialised.
  struct WideImpl : torch::nn::Module {
    WideImpl() {
      for (int i = 0; i < 6; ++i) register_parameter("p" + std::to_string(i), deferred_empty({256, 512}));
    }
  };
  const auto fill = [](const std::string& fqn, torch::Tensor& full) {
    const double k = static_cast<double>(fqn.back() - '0') + 1;
    full.copy_(torch::arange(full.numel(), torch::kFloat).reshape(full.sizes()).mul(k / full.numel()));
  };
  auto wide = std::make_shared<WideImpl>();
  auto options = default_options();
  int64_t peak_during_init = 0;
  const int64_t before = heap_bytes();
  options.param_init = [&](const std::string& fqn, torch::Tensor& full) {
    fill(fqn, full);
    peak_during_init = std::max(peak_during_init, heap_bytes() - before);
  };
  fully_shard(*wide, options);
  const int64_t param_bytes = 256 * 512 * 4;
  const int64_t shard_bytes = sharded_param_bytes(*wide);
  EXPECT_LE(peak_during_init, shard_bytes + param_bytes + (256 << 10));
  // At W=1 the shard is the whole model; above, the bound sits below it.
  if (test_world().size() > 1) {
    EXPECT_LT(peak_during_init, 6 * param_bytes) << "the whole model was materialised";
  }
  for (const auto& [name, value] : full_parameters(*wide)) {
    torch::Tensor expected = torch::empty({256, 512});
    fill(name, expected);
    EXPECT_TRUE(value.equal(expected)) << name;
  }
}

TEST(FullyShardInit, DeferredParametersWithoutAnInitFunctionAreAnError) {
  auto holder = Holder(deferred_empty({4}));
  expect_error_on_every_rank([&] { fully_shard(holder, default_options()); }, {"'w' is deferred", "param_init"});
}

TEST(FullyShardInit, MetaParametersAreRejectedWithTheAlternative) {
  auto holder = Holder(torch::empty({4}, torch::kMeta));
  expect_error_on_every_rank([&] { fully_shard(holder, default_options()); }, {"'w' is on the meta device", "deferred_empty"});
}

TEST(FullyShardInit, SyncModuleStatesTakesRankZerosValues) {
  auto model = make_tiny(tiny_config(), 100 + test_world().rank());  // a different init on each rank
  auto options = default_options();
  options.sync_module_states = true;
  for (auto& block : model->blocks) fully_shard(block, options);
  fully_shard(model, options);
  const auto rank0 = make_tiny(tiny_config(), 100);
  std::map<std::string, torch::Tensor> expected;
  for (const auto& item : rank0->named_parameters()) expected[item.key()] = item.value();
  for (const auto& [name, value] : full_parameters(*model)) EXPECT_TRUE(value.equal(expected.at(name))) << name;
}

TEST(FullyShardParams, IgnoredParametersStayWholeAndTiedOnesAreShared) {
  auto model = make_tiny(tiny_config(), kInitSeed);
  auto options = default_options();
  options.ignored_params = {model->wpe->weight};
  for (auto& block : model->blocks) fully_shard(block, options);
  fully_shard(model, options);
  EXPECT_EQ(model->wpe->weight.sizes(), (std::vector<int64_t>{tiny_config().seq, tiny_config().dim}));
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, shape] : parameter_shapes(*model)) shapes[name] = shape;
  EXPECT_EQ(shapes.at("wte.weight"), (std::vector<int64_t>{tiny_config().vocab, tiny_config().dim}));
  EXPECT_EQ(shapes.at("wpe.weight"), (std::vector<int64_t>{tiny_config().seq, tiny_config().dim}));
  EXPECT_EQ(model->wte->weight.dim(), 1) << "managed parameters hold their 1-D shard between steps";
  // The tied head is the embedding: one parameter, listed once.
  const auto params = unique_parameters(*model);
  EXPECT_EQ(std::count_if(params.begin(), params.end(),
                          [&](const torch::Tensor& p) { return p.is_same(model->wte->weight); }),
            1);
  auto tokens = global_batch(0, 2);
  torch::Tensor logits = fsdp::call(model, tokens.narrow(1, 0, tiny_config().seq));
  logits.sum().backward();
  EXPECT_EQ(model->wpe->weight.grad().sizes(), model->wpe->weight.sizes()) << "an ignored parameter keeps its full gradient";
}

bool cpu_has_fp16_kernels() {
  try {
    torch::layer_norm(torch::ones({2, 2}, torch::kHalf), {2});
    torch::ones({2, 2}, torch::kHalf).matmul(torch::ones({2, 2}, torch::kHalf));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

class GradScalerTraining : public ::testing::TestWithParam<torch::ScalarType> {};

TEST_P(GradScalerTraining, ScaledStepsMatchTheReplayedReference) {
  if (GetParam() == torch::kHalf && !cpu_has_fp16_kernels()) {
    GTEST_SKIP() << "this LibTorch has no fp16 LayerNorm/matmul on CPU; the bf16 case covers the scaler";
  }
  RunSpec spec;
  spec.compute_dtype = GetParam();
  spec.loss_scaling = true;
  ShardedRunLog log;
  const auto sharded = train_sharded(spec, &log);
  const auto reference = train_reference(spec);
  std::string worst;
  EXPECT_LE(max_relative_difference(sharded, reference, &worst), 1e-5) << worst;
  for (double s : log.loss_scales) EXPECT_EQ(s, kLossScale) << "no overflow expected at this scale";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GradScalerTraining, ::testing::Values(torch::kHalf, torch::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(GradScaler, AnOverflowOnOneRankSkipsTheStepEverywhere) {
  auto model = make_tiny(tiny_config(), kInitSeed);
  for (auto& block : model->blocks) fully_shard(block, default_options());
  fully_shard(model, default_options());
  torch::optim::AdamW optimizer(unique_parameters(*model), torch::optim::AdamWOptions(1e-2));
  ShardedGradScaler scaler(test_world().group(), GradScalerOptions{1024.0, 2.0, 0.5, 1000});
  const auto before = full_parameters(*model);
  auto tokens = global_batch(0, 2);
  scaler.scale(fsdp::call(model, tokens.narrow(1, 0, tiny_config().seq)).sum()).backward();
  if (test_world().rank() == test_world().size() - 1) {
    for (auto& p : unique_parameters(*model)) {
      if (p.grad().numel() > 0) {
        p.mutable_grad()[0] = std::numeric_limits<float>::infinity();
        break;
      }
    }
  }
  EXPECT_FALSE(scaler.step(optimizer));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 512.0);
  const auto after = full_parameters(*model);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(after[i].second.equal(before[i].second)) << after[i].first;
}

// A residual block, held by an FSDP_MODULE holder (block(x) runs its
// hooks) or by LibTorch's own (block(x) is block->forward(x)).
struct CalledBlockImpl : torch::nn::Module {
  explicit CalledBlockImpl(int64_t dim)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc(register_module("fc", torch::nn::Linear(dim, dim))) {}
  torch::Tensor forward(torch::Tensor x) { return x + torch::tanh(fc(norm(x))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc;
};
FSDP_MODULE(CalledBlock);
TORCH_MODULE_IMPL(PlainBlock, CalledBlockImpl);

template <typename Block>
struct CalledNetImpl : torch::nn::Module {
  explicit CalledNetImpl(int64_t dim) : head(register_module("head", torch::nn::Linear(dim, 1))) {
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block(dim)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) x = block(x);
    return head(x);
  }
  std::vector<Block> blocks;
  torch::nn::Linear head;
};
template <typename Block>
using CalledNet = torch::nn::ModuleHolder<CalledNetImpl<Block>>;

TEST(ModuleHolder, BlocksCalledAsModulesRunTheirHooksAndMatchOneProcess) {
  const int w = test_world().size();
  const int rank = test_world().rank();
  constexpr int64_t kDim = 13, kRows = 3;
  torch::manual_seed(kInitSeed);
  CalledNet<CalledBlock> net(kDim);
  torch::manual_seed(kInitSeed);
  CalledNet<CalledBlock> reference(kDim);  // not sharded: block(x) is plain forward
  for (auto& block : net->blocks) fully_shard(block, default_options());
  fully_shard(net, default_options());
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW reference_optimizer(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 3; ++step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(40 + step);
    const torch::Tensor x = torch::randn({kRows * w, kDim}, gen);
    const torch::Tensor y = torch::randn({kRows * w, 1}, gen);
    clear_event_log(*net);
    optimizer.zero_grad();
    torch::mse_loss(fsdp::call(net, x.narrow(0, rank * kRows, kRows)), y.narrow(0, rank * kRows, kRows)).backward();
    optimizer.step();
    reference_optimizer.zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    reference_optimizer.step();
    std::vector<std::string> pre_forwards;
    for (const auto& e : event_log(*net)) {
      if (e.kind == FSDPEvent::Kind::kPreForward) pre_forwards.push_back(e.unit);
    }
    EXPECT_EQ(pre_forwards, (std::vector<std::string>{"<root>", "block0", "block1", "block2"}));
  }
  std::string worst;
  NamedTensors expected;
  for (const auto& item : reference->named_parameters()) expected.emplace_back(item.key(), item.value().detach());
  EXPECT_LE(max_relative_difference(full_parameters(*net), expected, &worst), 1e-5) << worst;
}

TEST(ModuleHolder, ABlockCalledAroundItsHooksFailsNamingItAndTheFix) {
  torch::manual_seed(kInitSeed);
  CalledNet<PlainBlock> net(8);  // TORCH_MODULE holders: block(x) skips the hooks
  for (auto& block : net->blocks) fully_shard(block, default_options());
  fully_shard(net, default_options());
  expect_error_on_every_rank([&] { fsdp::call(net, torch::randn({2, 8})); },
                             {"the forward of", "block0", "fsdp::call(block, x)", "FSDP_MODULE(Block)"});
  EXPECT_EQ(memory::gathered_bytes(), 0) << "the failed forward left units gathered";
  // The same blocks through fsdp::call still train: the error left nothing behind.
  torch::Tensor h = torch::randn({2, 8});
  torch::Tensor out = fsdp::run(net, [&] {
    for (auto& block : net->blocks) h = fsdp::call(block, h);
    return net->head(h);
  });
  out.sum().backward();
  for (const auto& p : net->parameters()) EXPECT_TRUE(p.grad().defined());
}

TEST(ModuleHolder, AnErrorInAUnitCalledThroughItsHooksIsLeftAsLibTorchThrewIt) {
  torch::manual_seed(kInitSeed);
  CalledNet<CalledBlock> net(13);
  for (auto& block : net->blocks) fully_shard(block, default_options());
  fully_shard(net, default_options());
  try {
    fsdp::call(net, torch::randn({2, 5}));  // the wrong width: block0's norm refuses it
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    ADD_FAILURE() << "a shape error of a properly called unit was read as a unit called around its hooks: " << e.what();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("normalized_shape"), std::string::npos) << e.what();
  }
  dist::barrier(test_world().group());
  EXPECT_EQ(memory::gathered_bytes(), 0) << "the failed forward left units gathered";
}

}  // namespace
}  // namespace fsdp::testing::fully_shard_test
