// A user's own LibTorch program: a three-block model sharded block by
// block with fsdp.cpp, trained over the ranks a launcher started (`fsdp
// launch`, torchrun, Slurm), and checked against the same model trained in
// this process alone on the whole global batch. Exit 0 when they agree.

#include <cmath>
#include <cstdio>
#include <string>

#include <torch/torch.h>

#include <fsdp/common/env.h>
#include <fsdp/common/runtime.h>
#include <fsdp/core/fully_shard.h>
#include <fsdp/dist/launch_env.h>
#include <fsdp/dist/process_group.h>

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t dim)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc(register_module("fc", torch::nn::Linear(dim, dim))) {}
  torch::Tensor forward(torch::Tensor x) { return x + torch::gelu(fc(norm(x))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t dim) : head(register_module("head", torch::nn::Linear(dim, 1))) {
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block(dim)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) x = fsdp::call(block, x);  // runs the block's FSDP hooks
    return head(x);
  }
  std::vector<Block> blocks;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);

int main() {
  fsdp::init_runtime();
  const auto env = fsdp::current_env();
  auto world = fsdp::dist::World::init(fsdp::dist::parse_launch_env(env), fsdp::dist::DistOptions::from_env(env));
  const int w = world->size();
  const int rank = world->rank();
  constexpr int64_t kDim = 48, kRowsPerRank = 4;

  torch::manual_seed(0);  // the same initial weights on every rank, and in the reference
  Net net(kDim);
  torch::manual_seed(0);
  Net reference(kDim);

  fsdp::FullyShardOptions options;
  options.mesh = std::make_shared<fsdp::dist::DeviceMesh>(fsdp::make_mesh(world, fsdp::ShardingStrategy::kFullShard));
  for (auto& block : net->blocks) fsdp::fully_shard(block, options);
  fsdp::fully_shard(net, options);

  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW reference_optimizer(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  // One global batch, fitted for ten steps: the loss must fall.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100);
  const torch::Tensor x = torch::randn({kRowsPerRank * w, kDim}, gen);
  const torch::Tensor y = x.sum(1, /*keepdim=*/true).sin();
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < 10; ++step) {
    // This rank's rows, sharded.
    optimizer.zero_grad();
    torch::Tensor loss = torch::mse_loss(fsdp::call(net, x.narrow(0, rank * kRowsPerRank, kRowsPerRank)),
                                         y.narrow(0, rank * kRowsPerRank, kRowsPerRank));
    loss.backward();
    optimizer.step();
    // All rows, one process.
    reference_optimizer.zero_grad();
    torch::Tensor reference_loss = torch::mse_loss(reference->forward(x), y);
    reference_loss.backward();
    reference_optimizer.step();
    if (step == 0) first_loss = reference_loss.item<double>();
    last_loss = reference_loss.item<double>();
  }

  double worst = 0;
  std::string worst_name;
  const auto params = reference->named_parameters();
  for (const auto& [name, full] : fsdp::full_parameters(*net)) {
    const torch::Tensor& want = params[name];
    const double diff = ((full - want).norm() / want.norm()).item<double>();
    if (diff > worst) {
      worst = diff;
      worst_name = name;
    }
  }
  std::printf("rank %d of %d: loss %.4f -> %.4f, largest relative difference from one process %.2e (%s)\n", rank,
              w, first_loss, last_loss, worst, worst_name.c_str());
  const bool ok = worst <= 1e-5 && last_loss < first_loss;
  if (!ok) std::printf("rank %d: FAILED: the sharded model does not match one process\n", rank);
  return ok ? 0 : 1;
}
