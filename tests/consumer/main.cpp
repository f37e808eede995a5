// A user's own LibTorch program: a three-block model sharded block by
// block with fsdp.cpp, trained over the ranks a launcher started (`fsdp
// launch`, torchrun, Slurm), with a sharded checkpoint of its own, and
// checked against the same model trained in this process alone on the
// whole global batch.
//
//   consumer                 ten steps
//   consumer save DIR        the first five, then a checkpoint in DIR
//   consumer resume DIR      the checkpoint in DIR (any world size), then the last five
//
// Exit 0 when the weights after the last step run match one process's.

#include <cstdio>
#include <string>

#include <torch/torch.h>

#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/common/env.h>
#include <fsdp/common/runtime.h>
#include <fsdp/core/fully_shard.h>
#include <fsdp/core/module_holder.h>
#include <fsdp/distributed/launch_env.h>
#include <fsdp/distributed/process_group.h>

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t dim)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc(register_module("fc", torch::nn::Linear(dim, dim))) {}
  torch::Tensor forward(torch::Tensor x) { return x + torch::gelu(fc(norm(x))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc;
};
FSDP_MODULE(Block);  // block(x) runs the block's FSDP hooks

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t dim) : head(register_module("head", torch::nn::Linear(dim, 1))) {
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block(dim)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) x = block(x);
    return head(x);
  }
  std::vector<Block> blocks;
  torch::nn::Linear head;
};
FSDP_MODULE(Net);

constexpr int64_t kDim = 48, kGlobalRows = 12, kSteps = 10;  // 12 rows: every world size up to 4 divides them

// One global batch, fitted step after step: the loss must fall.
std::pair<torch::Tensor, torch::Tensor> global_batch() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100);
  torch::Tensor x = torch::randn({kGlobalRows, kDim}, gen);
  return {x, x.sum(1, /*keepdim=*/true).sin()};
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (!(argc == 1 || (argc == 3 && (mode == "save" || mode == "resume")))) {
    std::fprintf(stderr, "usage: %s [save DIR | resume DIR]\n", argv[0]);
    return 2;
  }
  fsdp::init_runtime();
  const auto env = fsdp::current_env();
  auto world = fsdp::dist::World::init(fsdp::dist::parse_launch_env(env), fsdp::dist::DistOptions::from_env(env));
  const int w = world->size();
  const int rank = world->rank();
  const auto [x, y] = global_batch();

  torch::manual_seed(0);  // the same initial weights on every rank
  Net net(kDim);
  fsdp::FullyShardOptions options;
  options.mesh = std::make_shared<fsdp::dist::DeviceMesh>(fsdp::make_mesh(world, fsdp::ShardingStrategy::kFullShard));
  for (auto& block : net->blocks) fsdp::fully_shard(block, options);
  fsdp::fully_shard(net, options);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-2));

  int64_t first = 0, last = kSteps;
  if (mode == "save") last = kSteps / 2;
  if (mode == "resume") {
    const auto checkpoint = fsdp::checkpoint::latest(argv[2]);
    if (!checkpoint) {
      std::fprintf(stderr, "no checkpoint in %s\n", argv[2]);
      return 1;
    }
    const auto state = fsdp::checkpoint::load(*checkpoint, *net, optimizer, *world);
    first = state.extra.at("next_step").get<int64_t>();
    if (rank == 0) std::printf("resumed at step %lld, saved at W = %d, now W = %d\n", static_cast<long long>(first),
                               static_cast<int>(state.mesh.empty() ? 0 : state.mesh[0] * state.mesh[1]), w);
  }
  const int64_t rows = kGlobalRows / w;
  for (int64_t step = first; step < last; ++step) {
    optimizer.zero_grad();
    torch::mse_loss(net(x.narrow(0, rank * rows, rows)), y.narrow(0, rank * rows, rows)).backward();
    optimizer.step();
  }
  if (mode == "save") {
    fsdp::checkpoint::TrainerState state;
    state.step = last;
    state.sharding = "full_shard";
    state.mesh = {1, w};
    state.extra = {{"next_step", last}};  // the program's own state
    fsdp::checkpoint::save(argv[2], /*keep=*/2, *net, optimizer, state, *world);
  }

  // The reference: all rows, one process, the same steps from the start.
  torch::manual_seed(0);
  Net reference(kDim);
  torch::optim::AdamW reference_optimizer(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  double first_loss = 0, last_loss = 0;
  for (int64_t step = 0; step < last; ++step) {
    reference_optimizer.zero_grad();
    torch::Tensor loss = torch::mse_loss(reference(x), y);
    loss.backward();
    reference_optimizer.step();
    if (step == 0) first_loss = loss.item<double>();
    last_loss = loss.item<double>();
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
  std::printf("rank %d of %d, steps %lld-%lld: loss %.4f -> %.4f, largest relative difference from one process %.2e (%s)\n",
              rank, w, static_cast<long long>(first), static_cast<long long>(last - 1), first_loss, last_loss, worst,
              worst_name.c_str());
  const bool ok = worst <= 1e-5 && last_loss < first_loss;
  if (!ok) std::printf("rank %d: FAILED: the sharded model does not match one process\n", rank);
  return ok ? 0 : 1;
}
