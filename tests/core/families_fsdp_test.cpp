// The Qwen3-MoE and tied-Llama families under FSDP (each block, experts
// included, one unit) against the same training in one process without
// FSDP: each rank's micro-batch forward and backward in turn, gradients
// averaged, the same AdamW steps.

#include <filesystem>

#include <gtest/gtest.h>

#include "../distributed/dist_test_world.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/models/hf/weights.h"
#include "fsdp/models/llama/model.h"
#include "fsdp/models/llama4/model.h"
#include "fsdp/models/parallelize.h"
#include "fsdp/models/qwen3/config.h"
#include "fsdp/nn/lm_loss.h"
#include "fsdp_test_support.h"

namespace fsdp::testing::families_fsdp_test {
namespace {

constexpr int64_t kRows = 2, kSeq = 16;

// Tokens (world * kRows, kSeq + 1) of step `step`, the same on every rank.
torch::Tensor step_batch(int step, int world) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + step));
  return torch::randint(0, 512, {world * kRows, kSeq + 1}, gen, torch::kLong);
}

// The language-model loss plus the model's auxiliary (load-balancing) loss.
torch::Tensor training_loss(models::CausalLMImpl& model, const torch::Tensor& hidden, const torch::Tensor& rows) {
  auto loss = nn::lm_loss(hidden, model.output_weight(), rows.narrow(1, 1, kSeq));
  if (const auto aux = model.auxiliary_loss(); aux.defined()) loss = loss + aux;
  return loss;
}

NamedTensors named(models::CausalLMImpl& model) {
  NamedTensors out;
  for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value().detach().clone());
  return out;
}

// A model of the family under test, initialised from the current seed.
using ModelFactory = std::function<std::shared_ptr<models::CausalLMImpl>()>;

ModelFactory llama_model(const models::LlamaConfig& config) {
  return [config] { return std::make_shared<models::LlamaForCausalLMImpl>(config); };
}

NamedTensors train_reference(const ModelFactory& make, int steps, int world,
                             torch::ScalarType compute_dtype = torch::kFloat) {
  torch::manual_seed(kInitSeed);
  const auto model_owner = make();
  auto& model = *model_owner;
  torch::optim::AdamW optim(model.parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0));
  // Mixed precision the classic way: the optimizer's fp32 master copied
  // into a low-precision twin for forward and backward, whose gradients are
  // widened to fp32.
  const bool mixed = compute_dtype != torch::kFloat;
  torch::manual_seed(kInitSeed);
  const auto twin_owner = make();
  auto& twin = *twin_owner;
  if (mixed) twin.to(compute_dtype);
  auto& compute = mixed ? twin : model;
  const auto master = model.parameters(), low = compute.parameters();
  for (int s = 0; s < steps; ++s) {
    const auto batch = step_batch(s, world);
    optim.zero_grad();
    if (mixed) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < master.size(); ++i) low[i].copy_(master[i]);
    }
    for (int r = 0; r < world; ++r) {
      const auto rows = batch.narrow(0, r * kRows, kRows);
      training_loss(compute, compute.forward(rows.narrow(1, 0, kSeq)), rows).backward();
      if (!mixed) continue;
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < master.size(); ++i) {
        if (!low[i].grad().defined()) continue;
        if (!master[i].grad().defined()) master[i].mutable_grad() = torch::zeros_like(master[i]);
        master[i].mutable_grad().add_(low[i].grad().to(torch::kFloat));
        low[i].mutable_grad() = torch::Tensor();
      }
    }
    // The mean of the ranks' gradients as FSDP takes it on Gloo: summed,
    // then divided (dividing each first rounds differently when W is not a
    // power of two, and AdamW's first steps magnify that on gradients that
    // nearly cancel).
    torch::NoGradGuard no_grad;
    for (auto& p : master) {
      if (p.grad().defined()) p.grad().div_(world);
    }
    optim.step();
  }
  return named(model);
}

NamedTensors train_sharded(const ModelFactory& make, int steps, std::shared_ptr<models::CausalLMImpl>* out,
                           bool activation_checkpoint = false, models::WrapPolicy wrap = {},
                           std::vector<std::pair<std::string, int64_t>>* units = nullptr,
                           ShardingStrategy strategy = ShardingStrategy::kFullShard,
                           torch::ScalarType compute_dtype = torch::kFloat) {
  auto& world = test_world();
  torch::manual_seed(kInitSeed);
  auto model = make();
  models::ParallelizeOptions options;
  options.fsdp.mesh = mesh_for(strategy);
  options.fsdp.strategy = strategy;
  if (compute_dtype != torch::kFloat) {
    options.fsdp.mixed_precision.param_dtype = compute_dtype;
    options.fsdp.mixed_precision.reduce_dtype = torch::kFloat;
  }
  options.activation_checkpoint = activation_checkpoint;
  options.wrap = wrap;
  const auto made = models::parallelize(*model, options);
  if (units != nullptr) *units = made;
  torch::optim::AdamW optim(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0));
  for (int s = 0; s < steps; ++s) {
    const auto rows = step_batch(s, world.size()).narrow(0, world.rank() * kRows, kRows);
    optim.zero_grad();
    training_loss(*model, fsdp::call(model, rows.narrow(1, 0, kSeq)), rows).backward();
    optim.step();
  }
  if (out != nullptr) *out = model;
  return full_parameters(*model);
}

TEST(Qwen3MoeFsdp, FullShardEqualsOneProcessOverFiveSteps) {
  const auto config = models::qwen3_preset("qwen3-moe-tiny");
  const int world = test_world().size();
  const auto sharded = train_sharded(llama_model(config), 5, nullptr);
  const auto reference = train_reference(llama_model(config), 5, world);
  std::string worst;
  EXPECT_LT(max_relative_difference(sharded, reference, &worst), 1e-5) << worst;
  // Activation checkpointing recomputes each block, router statistics
  // included (a block with two outputs).
  const auto checkpointed = train_sharded(llama_model(config), 5, nullptr, /*activation_checkpoint=*/true);
  EXPECT_LT(max_relative_difference(checkpointed, reference, &worst), 1e-5) << worst;
  // The routers and experts moved: the comparison is of trained weights.
  torch::manual_seed(kInitSeed);
  const auto initial = named(*llama_model(config)());
  EXPECT_GT(max_relative_difference(reference, initial, &worst), 1e-3);
}

TEST(Qwen3MoeFsdp, ShardGradOpAndHybridShardEqualOneProcess) {
  // SHARD_GRAD_OP keeps blocks gathered from forward to backward, so the
  // router statistics' second backward meets a gathered router; HSDP adds
  // the replica all-reduce (shard groups of 2 at W = 4, of 1 at W = 2).
  const auto config = models::qwen3_preset("qwen3-moe-tiny");
  const auto reference = train_reference(llama_model(config), 3, test_world().size());
  for (const auto strategy : {ShardingStrategy::kShardGradOp, ShardingStrategy::kHybridShard}) {
    if (strategy == ShardingStrategy::kHybridShard && hybrid_fsdp_size(test_world().size()) == 0) continue;
    const auto sharded = train_sharded(llama_model(config), 3, nullptr, false, {}, nullptr, strategy);
    std::string worst;
    EXPECT_LT(max_relative_difference(sharded, reference, &worst), 1e-5) << to_string(strategy) << ": " << worst;
  }
}

TEST(Qwen3MoeFsdp, Bf16ComputeEqualsOneProcessReplayingEachRankInBf16) {
  // bf16 parameters and activations, fp32 reduction and master weights;
  // the router's softmax and top-k stay fp32 inside the block.
  const auto config = models::qwen3_preset("qwen3-moe-tiny");
  const auto sharded = train_sharded(llama_model(config), 3, nullptr, false, {}, nullptr, ShardingStrategy::kFullShard,
                                     torch::kBFloat16);
  const auto reference = train_reference(llama_model(config), 3, test_world().size(), torch::kBFloat16);
  std::string worst;
  EXPECT_LT(max_relative_difference(sharded, reference, &worst), 1e-5) << worst;
  // Not the fp32 run: bf16 compute changed the trained weights.
  EXPECT_GT(max_relative_difference(reference, train_reference(llama_model(config), 3, test_world().size()), &worst), 1e-4);
}

TEST(Llama4Fsdp, FullShardEqualsOneProcessWithAndWithoutActivationCheckpointing) {
  // Every Llama 4 layer kind (llama4-tiny): the fused experts shard as one
  // flat unit with their block; the load-balancing loss is per rank, so
  // the reference replays each rank's micro-batch.
  const ModelFactory make = [] { return std::make_shared<models::Llama4ForCausalLMImpl>(models::llama4_preset("llama4-tiny")); };
  const int world = test_world().size();
  const auto reference = train_reference(make, 4, world);
  std::string worst;
  EXPECT_LT(max_relative_difference(train_sharded(make, 4, nullptr), reference, &worst), 1e-5) << worst;
  const auto checkpointed = train_sharded(make, 4, nullptr, /*activation_checkpoint=*/true);
  EXPECT_LT(max_relative_difference(checkpointed, reference, &worst), 1e-5) << worst;
  const auto grad_op = train_sharded(make, 4, nullptr, false, {}, nullptr, ShardingStrategy::kShardGradOp);
  EXPECT_LT(max_relative_difference(grad_op, reference, &worst), 1e-5) << worst;
  // Training moved the fused experts (not only the dense weights).
  torch::manual_seed(kInitSeed);
  const auto initial = named(*make());
  for (size_t i = 0; i < initial.size(); ++i) {
    if (initial[i].first.find("experts.gate_up_proj") == std::string::npos) continue;
    EXPECT_GT((reference[i].second - initial[i].second).abs().max().item<double>(), 1e-4) << initial[i].first;
  }
}

TEST(TiedLlamaFsdp, TrainsLikeOneProcessAndExportsItsHeadAsTheEmbedding) {
  auto config = models::llama_preset("llama-tiny");
  config.tie_word_embeddings = true;
  auto& world = test_world();
  std::shared_ptr<models::CausalLMImpl> model;
  const auto sharded = train_sharded(llama_model(config), 3, &model);
  const auto reference = train_reference(llama_model(config), 3, world.size());
  std::string worst;
  EXPECT_LT(max_relative_difference(sharded, reference, &worst), 1e-5) << worst;
  EXPECT_EQ(std::count_if(sharded.begin(), sharded.end(), [](const auto& p) { return p.first == "lm_head.weight"; }), 0);

  const std::string dir = std::filesystem::temp_directory_path().string() + "/fsdp-tied-export-" +
                          std::to_string(world.size()) + "-" + std::getenv("MASTER_PORT");
  if (world.rank() == 0) {
    models::save_hf_pretrained(*model, sharded, dir);
    // As Hugging Face saves tied models: the embedding only; loading makes
    // the head that same tensor.
    io::SafetensorsFile file(dir + "/model.safetensors");
    EXPECT_EQ(file.find("lm_head.weight"), nullptr);
    auto loaded = models::load_hf_pretrained(dir);
    const auto& trained_embedding = reference.front();
    ASSERT_EQ(trained_embedding.first, "model.embed_tokens.weight");
    EXPECT_TRUE(loaded->output_weight().equal(file.view("model.embed_tokens.weight")));
    EXPECT_TRUE(torch::allclose(loaded->output_weight(), trained_embedding.second, 1e-5, 1e-6));
    std::filesystem::remove_all(dir);
  }
  dist::barrier(world.group());
}

TEST(WrapPolicyFsdp, SizeMakesEachModuleWithEnoughOwnParametersAUnitAndTrainsTheSame) {
  // llama-tiny: attention 2*64*64 + 2*64*32 = 12288 parameters, MLP
  // 3*64*176 = 33792, a block's own (its norms) 128. size:10000 makes the
  // attentions and MLPs units; the blocks keep nothing of their own.
  const auto config = models::llama_preset("llama-tiny");
  std::vector<std::pair<std::string, int64_t>> units;
  std::shared_ptr<models::CausalLMImpl> model;
  const auto sharded =
      train_sharded(llama_model(config), 3, &model, false, models::parse_wrap_policy("size:10000", "test"), &units);
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"model.layers.0.self_attn", 12288}, {"model.layers.0.mlp", 33792},
      {"model.layers.1.self_attn", 12288}, {"model.layers.1.mlp", 33792},
      {"", 2 * 512 * 64 + 64 + 2 * 128}};
  EXPECT_EQ(units, expected);
  auto& llama = dynamic_cast<models::LlamaForCausalLMImpl&>(*model);
  EXPECT_TRUE(is_fully_sharded(*llama.model->layer(0).self_attn));
  EXPECT_FALSE(is_fully_sharded(llama.model->layer(0)));
  std::string worst;
  EXPECT_LT(max_relative_difference(sharded, train_reference(llama_model(config), 3, test_world().size()), &worst), 1e-5) << worst;
  // A limit above every module: the root holds everything.
  train_sharded(llama_model(config), 1, nullptr, false, models::parse_wrap_policy("size:1e6", "test"), &units);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_EQ(units[0].second, models::llama_parameter_count(config));
}

TEST(WrapPolicyFsdp, SizeOnQwen3MoeWrapsWholeSparseBlocksNeverSingleExperts) {
  // An expert (3*64*32 = 6144) would pass size:5000 alone, but experts run
  // only where tokens are routed: the sparse block (gate 512 + 8 experts)
  // is the unit.
  const auto config = models::qwen3_preset("qwen3-moe-tiny");
  std::vector<std::pair<std::string, int64_t>> units;
  const auto sharded =
      train_sharded(llama_model(config), 3, nullptr, false, models::parse_wrap_policy("size:5000", "test"), &units);
  bool sparse_unit = false;
  for (const auto& [name, count] : units) {
    EXPECT_EQ(name.find("experts"), std::string::npos) << name;
    if (name == "model.layers.0.mlp") sparse_unit = count == 512 + 8 * 6144;
  }
  EXPECT_TRUE(sparse_unit);
  std::string worst;
  EXPECT_LT(max_relative_difference(sharded, train_reference(llama_model(config), 3, test_world().size()), &worst), 1e-5) << worst;
}

}  // namespace
}  // namespace fsdp::testing::families_fsdp_test
