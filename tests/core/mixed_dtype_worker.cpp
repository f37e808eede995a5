// Trains a model whose units hold three dtypes (a frozen bf16 base, fp32
// norms, fp64 adapters) under fully_shard at the launcher's world size, so
// a test can save its checkpoint at one world size and resume it at another:
//   mixed_dtype_worker DIR STEPS [save-at K | resume | reference W1 K W2]
// Plain: trains STEPS steps. save-at K: trains K steps and saves DIR/ckpt.
// resume: loads DIR/ckpt's latest, then trains on to STEPS. Rank 0 writes
// the final parameters, whole and in module order, to DIR/params_wW.pt
// (torch::save of a tensor list). Every step's global batch is the same at
// every world size: 6 rows, split evenly over 1, 2 or 3 ranks.
// reference (one process, no FSDP): the same STEPS steps, the first K with
// the batch's rows split as W1 ranks split them and the rest as W2 ranks
// do, each rank's rows run on their own and their gradients averaged: bf16
// matrix products round differently for 2 rows than for 3, so what the
// ranks compute depends on the split, not only on the batch. Writes
// DIR/params_reference.pt.

#include <cstdio>
#include <string>

#include <torch/torch.h>

#include "adapter_net.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/error.h"
#include "fsdp/common/error_text.h"
#include "fsdp/common/runtime.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/process_group.h"

namespace {

using fsdp::testing::AdapterNet;

constexpr int64_t kGlobalRows = 6;

AdapterNet build() {
  fsdp::testing::AdapterNetConfig config;
  config.adapters = true;
  config.own_dtype_linears = true;
  auto net = fsdp::testing::make_adapter_net(config, 1234);
  for (auto& b : net->blocks) {
    b->base->to(torch::kBFloat16);
    for (auto& p : b->base->parameters()) p.set_requires_grad(false);
    b->lora_a->to(torch::kDouble);
    b->lora_b->to(torch::kDouble);
  }
  return net;
}

torch::Tensor inputs(int64_t step, int64_t dim, torch::Tensor* targets) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  torch::Tensor x = torch::randn({kGlobalRows, dim}, gen);
  *targets = torch::randn({kGlobalRows, 2}, gen);
  return x;
}

int reference(const std::string& dir, int64_t steps, int w1, int64_t switch_at, int w2) {
  auto net = build();
  std::vector<torch::Tensor> trainable;
  for (const auto& p : net->parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  torch::optim::AdamW optimizer(trainable, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int64_t step = 0; step < steps; ++step) {
    const int w = step < switch_at ? w1 : w2;
    const int64_t rows = kGlobalRows / w;
    torch::Tensor y;
    const torch::Tensor x = inputs(step, net->config.dim, &y);
    for (int r = 0; r < w; ++r) {
      (torch::mse_loss(net->forward(x.narrow(0, r * rows, rows)), y.narrow(0, r * rows, rows)) / w).backward();
    }
    optimizer.step();
    optimizer.zero_grad();
  }
  std::vector<torch::Tensor> tensors;
  for (const auto& p : net->parameters()) tensors.push_back(p.detach());
  torch::save(tensors, dir + "/params_reference.pt");
  return 0;
}

int run(int argc, char** argv) {
  FSDP_CHECK(argc >= 3, "usage: mixed_dtype_worker DIR STEPS [save-at K | resume]");
  const std::string dir = argv[1];
  const int64_t steps = std::stoll(argv[2]);
  const std::string mode = argc > 3 ? argv[3] : "";
  const int64_t save_at = mode == "save-at" ? std::stoll(argv[4]) : -1;
  if (mode == "reference") {
    FSDP_CHECK(argc == 7, "usage: mixed_dtype_worker DIR STEPS reference W1 K W2");
    return reference(dir, steps, std::stoi(argv[4]), std::stoll(argv[5]), std::stoi(argv[6]));
  }

  const fsdp::EnvMap env = fsdp::current_env();
  fsdp::init_runtime();
  auto world = fsdp::dist::World::init(fsdp::dist::parse_launch_env(env), fsdp::dist::DistOptions::from_env(env));
  const int w = world->size(), rank = world->rank();
  FSDP_CHECK(kGlobalRows % w == 0, "the global batch of ", kGlobalRows, " rows does not split over ", w, " ranks");

  auto net = build();
  fsdp::FullyShardOptions options;
  options.mesh = std::make_shared<fsdp::dist::DeviceMesh>(fsdp::dist::DeviceMesh::make_1d(world));
  for (auto& b : net->blocks) fsdp::fully_shard(b, options);
  fsdp::fully_shard(net, options);
  std::vector<torch::Tensor> trainable;
  for (const auto& p : fsdp::unique_parameters(*net)) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  torch::optim::AdamW optimizer(trainable, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));

  int64_t step = 0;
  if (mode == "resume") {
    const auto latest = fsdp::checkpoint::latest(dir + "/ckpt");
    FSDP_CHECK(latest.has_value(), "no checkpoint in ", dir, "/ckpt");
    step = fsdp::checkpoint::load(*latest, *net, optimizer, *world).step;
  }
  const int64_t rows = kGlobalRows / w;
  for (; step < (save_at >= 0 ? save_at : steps); ++step) {
    torch::Tensor y;
    const torch::Tensor x = inputs(step, net->config.dim, &y).narrow(0, rank * rows, rows);
    torch::mse_loss(fsdp::call(net, x), y.narrow(0, rank * rows, rows)).backward();
    optimizer.step();
    optimizer.zero_grad();
  }
  if (save_at >= 0) {
    fsdp::checkpoint::TrainerState state;
    state.step = step;
    fsdp::checkpoint::save(dir + "/ckpt", 1, *net, optimizer, state, *world);
  }
  const auto full = fsdp::full_parameters(*net);
  if (rank == 0) {
    std::vector<torch::Tensor> tensors;
    for (const auto& [name, t] : full) tensors.push_back(t);
    torch::save(tensors, dir + "/params_w" + std::to_string(w) + ".pt");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", fsdp::error_text(e).c_str());
    return 1;
  }
}
