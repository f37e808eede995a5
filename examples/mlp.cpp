// The two-layer MLP of the classic FSDP example, sharded with fsdp.cpp.
// Run: build/fsdp launch -n 2 -- build/examples/fsdp_example_mlp

#include <torch/torch.h>

#include "fsdp/common/runtime.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/core/memory.h"
#include "fsdp/core/module_holder.h"

struct MyModelImpl : torch::nn::Module {
  torch::nn::Linear layer1{register_module("layer1", torch::nn::Linear(1024, 4096))};
  torch::nn::Linear layer2{register_module("layer2", torch::nn::Linear(4096, 1024))};
  torch::Tensor forward(torch::Tensor x) { return layer2(torch::relu(layer1(x))); }
};
FSDP_MODULE(MyModel);  // model(x) runs FSDP's hooks (TORCH_MODULE's would not)

int main() {
  fsdp::init_runtime();
  const auto env = fsdp::current_env();
  auto world = fsdp::dist::World::init(fsdp::dist::parse_launch_env(env), fsdp::dist::DistOptions::from_env(env));

  torch::manual_seed(0);  // the same initial weights on every rank
  MyModel model;
  fsdp::FullyShardOptions options;
  options.mesh = std::make_shared<fsdp::dist::DeviceMesh>(fsdp::make_mesh(world, fsdp::ShardingStrategy::kFullShard));
  fsdp::fully_shard(model, options);  // one unit: the whole model

  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));
  torch::manual_seed(1 + world->rank());  // each rank its own batch, learned over the steps
  const auto inputs = torch::randn({16, 1024});
  const auto labels = torch::randn({16, 1024});
  for (int step = 0; step < 10; ++step) {
    optimizer.zero_grad();
    auto loss = torch::mse_loss(model(inputs), labels);
    loss.backward();
    optimizer.step();
    if (world->rank() == 0) std::printf("Step %d, Loss: %.4f\n", step, loss.item<float>());
  }
  const auto stats = fsdp::memory_stats(*model, &optimizer);
  std::printf("rank %d holds %lld parameter bytes of %lld\n", world->rank(),
              static_cast<long long>(stats.sharded_param_bytes), static_cast<long long>((1024 * 4096 * 2 + 4096 + 1024) * 4));
  return 0;
}
