// fsdp::replicate (DDP) on a residual MLP, for the reference test against
// PyTorch's DistributedDataParallel and for bench/replicate_vs_ddp.py:
//
//   fsdp launch -n W -- fsdp_replicate_probe INIT.safetensors DATA.safetensors OUT.safetensors [BENCH_STEPS]
//
// INIT holds the initial weights under the names below; DATA `x` (S, R, D)
// and `y` (S, R, 1): S steps of a global batch of R rows, each rank taking
// its R / W. AdamW (lr 1e-3, no weight decay; fsdp.cpp's fused one). Rank 0 writes to OUT `loss`
// (S,), each step's loss averaged over the ranks, and the final weights.
// With BENCH_STEPS, after those steps it times BENCH_STEPS more on the last
// batch and prints "rows/s N" (rank 0).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "fsdp/common/env.h"
#include "fsdp/common/error.h"
#include "fsdp/common/runtime.h"
#include "fsdp/core/module_holder.h"
#include "fsdp/core/replicate.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/distributed/launch_env.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/optim/fused_adamw.h"

// x + fc2(gelu(fc1(norm(x)))), as the Python peer's Block.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t dim)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc1(register_module("fc1", torch::nn::Linear(dim, 4 * dim))),
        fc2(register_module("fc2", torch::nn::Linear(4 * dim, dim))) {}
  torch::Tensor forward(torch::Tensor x) { return x + fc2(torch::gelu(fc1(norm(x)))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl(int64_t dim, int64_t blocks) : head(register_module("head", torch::nn::Linear(dim, 1))) {
    for (int64_t i = 0; i < blocks; ++i) this->blocks.push_back(register_module("block" + std::to_string(i), Block(dim)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) x = block(x);
    return head(x);
  }
  std::vector<Block> blocks;
  torch::nn::Linear head;
};
FSDP_MODULE(Net);

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: %s INIT.safetensors DATA.safetensors OUT.safetensors [BENCH_STEPS]\n", argv[0]);
    return 2;
  }
  try {
    fsdp::init_runtime();
    const auto env = fsdp::current_env();
    auto world = fsdp::dist::World::init(fsdp::dist::parse_launch_env(env), fsdp::dist::DistOptions::from_env(env));
    const fsdp::io::SafetensorsFile init(argv[1]);
    const fsdp::io::SafetensorsFile data(argv[2]);
    const at::Tensor x = data.view("x").clone();
    const at::Tensor y = data.view("y").clone();
    const int64_t dim = x.size(2);
    int64_t blocks = 0;
    while (init.find("block" + std::to_string(blocks) + ".norm.weight") != nullptr) ++blocks;
    Net net(dim, blocks);
    {
      torch::NoGradGuard no_grad;
      for (auto& item : net->named_parameters()) item.value().copy_(init.view(item.key()));
    }
    fsdp::ReplicateOptions replicate_options{world};
    // FSDP_PROBE_BUCKET_MB: smaller buckets, several per model.
    if (const char* cap = std::getenv("FSDP_PROBE_BUCKET_MB")) replicate_options.bucket_cap_mb = std::stod(cap);
    fsdp::replicate(net, replicate_options);
    fsdp::optim::FusedAdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.0));
    const int64_t rows = x.size(1) / world->size();
    const auto step = [&](int64_t s) {
      optimizer.zero_grad();
      at::Tensor loss = torch::mse_loss(net(x[s].narrow(0, world->rank() * rows, rows)),
                                        y[s].narrow(0, world->rank() * rows, rows));
      loss.backward();
      optimizer.step();
      return loss.detach().clone();
    };
    std::vector<at::Tensor> losses;
    for (int64_t s = 0; s < x.size(0); ++s) {
      at::Tensor loss = step(s);
      fsdp::dist::all_reduce(world->group(), loss, fsdp::dist::ReduceOp::kAvg).wait();
      losses.push_back(loss);
    }
    if (argc == 5) {
      const int64_t timed = std::stoll(argv[4]);
      fsdp::dist::barrier(world->group());
      const auto start = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < timed; ++i) step(x.size(0) - 1);
      fsdp::dist::barrier(world->group());
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (world->rank() == 0) std::printf("rows/s %.1f\n", static_cast<double>(timed * x.size(1)) / seconds);
    }
    if (world->rank() == 0) {
      std::vector<std::pair<std::string, at::Tensor>> out{{"loss", at::stack(losses)}};
      for (const auto& item : net->named_parameters()) out.emplace_back(item.key(), item.value().detach().contiguous());
      fsdp::io::write_safetensors(argv[3], out);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_replicate_probe: %s\n", e.what());
    return 1;
  }
}
