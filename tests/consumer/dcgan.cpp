// A program in the shape of PyTorch's C++ DCGAN example, small: a generator
// and a discriminator with BatchNorm, an Adam optimizer each, alternating
// steps (the discriminator on real and on generated images, then the
// generator through the discriminator), a StepLR on the generator's rate
// and a counter of the program's own, all in one checkpoint.
//
//   dcgan DIR WAY STEPS [save-at K | resume | bf16]   under fsdp launch, WAY fully_shard or replicate
//   dcgan DIR reference STEPS W1 K W2          one process, no FSDP
//
// Every step's global batch is 6 rows, the same at every world size, split
// evenly over 1, 2 or 3 ranks. save-at K trains K steps and saves DIR/ckpt;
// resume loads its latest and trains on to STEPS. Rank 0 then writes both
// models' full parameters and its buffers, in module order, to
// DIR/<WAY>_w<W>.pt, and every rank its buffers after a forward in eval
// mode to DIR/<WAY>_buffers_rank<R>.pt. bf16 trains STEPS under a bf16
// mixed-precision policy with its defaults (BatchNorm kept in fp32), checks
// in every forward that the convolutions compute in bf16 and the norms in
// fp32, and writes DIR/<WAY>_bf16_w<W>.pt.
//
// The reference trains the same steps as the ranks would, rank by rank:
// each rank's rows forward on their own (BatchNorm normalises by the rows
// it is given) and the gradients averaged; only rank 0's rows move the
// running statistics, which are rank 0's under both ways ([Note: buffers
// under replicate], [Note: buffers under fully_shard]). The first K steps
// split the batch over W1 ranks, the rest over W2. Writes
// DIR/reference_<STEPS>.pt.

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/error.h"
#include "fsdp/common/error_text.h"
#include "fsdp/common/runtime.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/core/replicate.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/process_group.h"

namespace {

namespace nn = torch::nn;

constexpr int64_t kGlobalRows = 6, kNoise = 4;

// Set under a bf16 policy: each forward checks the dtypes its layers
// compute in.
bool check_bf16_compute = false;

void expect_compute_dtypes(const nn::Module& conv, const nn::Module& norm) {
  if (!check_bf16_compute) return;
  const auto dtype = [](const nn::Module& m) { return m.named_parameters(false)["weight"].scalar_type(); };
  FSDP_CHECK(dtype(conv) == torch::kBFloat16 && dtype(norm) == torch::kFloat, "under the bf16 policy ", conv.name(),
             " computes in ", dtype(conv), " (expected BFloat16) and ", norm.name(), " in ", dtype(norm),
             " (expected Float)");
}

struct GeneratorImpl : nn::Module {
  GeneratorImpl()
      : up1(nn::ConvTranspose2dOptions(kNoise, 8, 4).bias(false)),
        norm1(8),
        up2(nn::ConvTranspose2dOptions(8, 1, 4).stride(2).padding(1).bias(false)) {
    register_module("up1", up1);
    register_module("norm1", norm1);
    register_module("up2", up2);
  }
  torch::Tensor forward(const torch::Tensor& z) {
    expect_compute_dtypes(*up1, *norm1);
    return torch::tanh(up2(torch::relu(norm1(up1(z)))));
  }
  nn::ConvTranspose2d up1;
  nn::BatchNorm2d norm1;
  nn::ConvTranspose2d up2;
};
TORCH_MODULE(Generator);

struct DiscriminatorImpl : nn::Module {
  DiscriminatorImpl()
      : conv1(nn::Conv2dOptions(1, 8, 4).stride(2).padding(1).bias(false)),
        conv2(nn::Conv2dOptions(8, 16, 4).stride(2).padding(1).bias(false)),
        norm2(16),
        conv3(nn::Conv2dOptions(16, 1, 2).bias(false)) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("norm2", norm2);
    register_module("conv3", conv3);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    expect_compute_dtypes(*conv2, *norm2);
    auto h = torch::leaky_relu(conv1(x), 0.2);
    h = torch::leaky_relu(norm2(conv2(h)), 0.2);
    return torch::sigmoid(conv3(h)).view({-1});
  }
  nn::Conv2d conv1, conv2;
  nn::BatchNorm2d norm2;
  nn::Conv2d conv3;
};
TORCH_MODULE(Discriminator);

struct Batch {
  torch::Tensor real, noise;  // the global batch's
};

Batch batch(int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + step);
  // "Images": a bright square at a place of the step's choosing, with noise.
  torch::Tensor real = torch::full({kGlobalRows, 1, 8, 8}, -1.0);
  for (int64_t r = 0; r < kGlobalRows; ++r) {
    const int64_t at = (step + r) % 5;
    real[r][0].narrow(0, at, 3).narrow(1, at, 3).fill_(1.0);
  }
  real += 0.1 * torch::randn(real.sizes(), gen);
  return {real, torch::randn({kGlobalRows, kNoise, 1, 1}, gen)};
}

torch::optim::AdamOptions adam_options() { return torch::optim::AdamOptions(2e-3).betas({0.5, 0.999}); }

std::vector<torch::Tensor> buffers(Generator& g, Discriminator& d) {
  std::vector<torch::Tensor> out;
  for (const auto& b : g->buffers()) out.push_back(b.detach().clone());
  for (const auto& b : d->buffers()) out.push_back(b.detach().clone());
  return out;
}

// While a rank other than 0's rows run: BatchNorm's momentum at 0, so the
// running statistics keep rank 0's values (they are saved for backward,
// and must not be written over after the forward), and the count of
// batches put back.
struct OnlyRankZeroMovesTheStatistics {
  explicit OnlyRankZeroMovesTheStatistics(nn::Module& m) {
    for (const auto& child : m.modules()) {
      if (auto* norm = dynamic_cast<nn::BatchNorm2dImpl*>(child.get())) {
        norms.emplace_back(norm, norm->options.momentum());
        counts.push_back(norm->num_batches_tracked.clone());
        norm->options.momentum(0.0);
      }
    }
  }
  ~OnlyRankZeroMovesTheStatistics() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < norms.size(); ++i) {
      norms[i].first->options.momentum(norms[i].second);
      norms[i].first->num_batches_tracked.copy_(counts[i]);
    }
  }
  std::vector<std::pair<nn::BatchNorm2dImpl*, std::optional<double>>> norms;
  std::vector<torch::Tensor> counts;
};

int reference(const std::string& dir, int64_t steps, int w1, int64_t switch_at, int w2) {
  torch::manual_seed(1);
  Generator g;
  Discriminator d;
  torch::optim::Adam g_adam(g->parameters(), adam_options()), d_adam(d->parameters(), adam_options());
  torch::optim::StepLR g_schedule(g_adam, /*step_size=*/2, /*gamma=*/0.5);
  // Runs fn(r, rows) for each rank's rows; rank 0's alone move the statistics.
  const auto per_rank = [](int w, nn::Module& m, const auto& fn) {
    for (int r = 0; r < w; ++r) {
      if (r == 0) {
        fn(r, kGlobalRows / w);
      } else {
        OnlyRankZeroMovesTheStatistics keep(m);
        fn(r, kGlobalRows / w);
      }
    }
  };
  for (int64_t step = 0; step < steps; ++step) {
    const int w = step < switch_at ? w1 : w2;
    const Batch b = batch(step);
    d_adam.zero_grad();
    g_adam.zero_grad();
    per_rank(w, *d, [&](int r, int64_t rows) {
      const auto out = d(b.real.narrow(0, r * rows, rows));
      (torch::binary_cross_entropy(out, torch::ones_like(out)) / w).backward();
    });
    std::vector<torch::Tensor> fakes;
    per_rank(w, *g, [&](int r, int64_t rows) { fakes.push_back(g(b.noise.narrow(0, r * rows, rows))); });
    per_rank(w, *d, [&](int r, int64_t rows) {
      const auto out = d(fakes[static_cast<size_t>(r)].detach());
      (torch::binary_cross_entropy(out, torch::zeros_like(out)) / w).backward();
    });
    d_adam.step();
    per_rank(w, *d, [&](int r, int64_t rows) {
      const auto out = d(fakes[static_cast<size_t>(r)]);
      (torch::binary_cross_entropy(out, torch::ones_like(out)) / w).backward();
    });
    g_adam.step();
    g_schedule.step();
  }
  std::vector<torch::Tensor> tensors;
  for (const auto& p : g->parameters()) tensors.push_back(p.detach());
  for (const auto& p : d->parameters()) tensors.push_back(p.detach());
  for (const auto& b : buffers(g, d)) tensors.push_back(b);
  torch::save(tensors, dir + "/reference_" + std::to_string(steps) + ".pt");
  return 0;
}

int run(int argc, char** argv) {
  FSDP_CHECK(argc >= 4, "usage: dcgan DIR fully_shard|replicate|reference STEPS ...");
  const std::string dir = argv[1], way = argv[2];
  const int64_t steps = std::stoll(argv[3]);
  const std::string mode = argc > 4 ? argv[4] : "";
  if (way == "reference") {
    FSDP_CHECK(argc == 7, "usage: dcgan DIR reference STEPS W1 K W2");
    return reference(dir, steps, std::stoi(argv[4]), std::stoll(argv[5]), std::stoi(argv[6]));
  }
  FSDP_CHECK(way == "fully_shard" || way == "replicate", "WAY is fully_shard, replicate or reference, not ", way);
  const int64_t save_at = mode == "save-at" ? std::stoll(argv[5]) : -1;
  const bool bf16 = mode == "bf16";

  const fsdp::EnvMap env = fsdp::current_env();
  fsdp::init_runtime();
  auto world = fsdp::dist::World::init(fsdp::dist::parse_launch_env(env), fsdp::dist::DistOptions::from_env(env));
  const int w = world->size(), rank = world->rank();
  FSDP_CHECK(kGlobalRows % w == 0, "the global batch of ", kGlobalRows, " rows does not split over ", w, " ranks");

  torch::manual_seed(1);
  Generator g;
  Discriminator d;
  if (way == "fully_shard") {
    fsdp::FullyShardOptions options;
    options.mesh = std::make_shared<fsdp::dist::DeviceMesh>(fsdp::dist::DeviceMesh::make_1d(world));
    if (bf16) options.mixed_precision.param_dtype = torch::kBFloat16;
    fsdp::fully_shard(g, options);
    fsdp::fully_shard(d, options);
  } else {
    fsdp::ReplicateOptions options{world};
    if (bf16) options.mixed_precision.param_dtype = torch::kBFloat16;
    fsdp::replicate(g, options);
    fsdp::replicate(d, options);
  }
  torch::optim::Adam g_adam(fsdp::unique_parameters(*g), adam_options());
  torch::optim::Adam d_adam(fsdp::unique_parameters(*d), adam_options());
  torch::optim::StepLR g_schedule(g_adam, /*step_size=*/2, /*gamma=*/0.5);
  fsdp::checkpoint::SchedulerState schedule_state(g_schedule);
  nlohmann::json program = {{"rows_seen", 0}};
  fsdp::checkpoint::JsonState program_state(program);
  fsdp::checkpoint::Parts parts;
  parts.model("generator", *g)
      .model("discriminator", *d)
      .optimizer("generator_adam", g_adam)
      .optimizer("discriminator_adam", d_adam)
      .state("generator_schedule", schedule_state)
      .state("program", program_state);

  int64_t step = 0;
  if (mode == "resume") {
    const auto latest = fsdp::checkpoint::latest(dir + "/ckpt");
    FSDP_CHECK(latest.has_value(), "no checkpoint in ", dir, "/ckpt");
    step = fsdp::checkpoint::load(*latest, parts, *world).step;
    FSDP_CHECK(program["rows_seen"].get<int64_t>() == step * kGlobalRows, "the program's own state came back as ",
               program.dump(), " at step ", step);
  }
  const int64_t rows = kGlobalRows / w;
  check_bf16_compute = bf16;
  for (; step < (save_at >= 0 ? save_at : steps); ++step) {
    const Batch b = batch(step);
    const torch::Tensor real = b.real.narrow(0, rank * rows, rows), noise = b.noise.narrow(0, rank * rows, rows);
    // The example's order: the generator is zeroed after its forward, while
    // its unit (a root, kept gathered until its backward) holds the
    // gradients of the last step aside; the zeroing reaches them there.
    d->zero_grad();
    // Under the bf16 policy the discriminator's output is bf16, and the
    // loss is taken in fp32 as a careful user would.
    auto out = fsdp::call(d, real).to(torch::kFloat);
    torch::binary_cross_entropy(out, torch::ones_like(out)).backward();
    const torch::Tensor fake = fsdp::call(g, noise);
    out = fsdp::call(d, fake.detach()).to(torch::kFloat);
    torch::binary_cross_entropy(out, torch::zeros_like(out)).backward();
    d_adam.step();
    g->zero_grad();
    out = fsdp::call(d, fake).to(torch::kFloat);
    torch::binary_cross_entropy(out, torch::ones_like(out)).backward();
    g_adam.step();
    g_schedule.step();
    program["rows_seen"] = program["rows_seen"].get<int64_t>() + kGlobalRows;
  }
  if (save_at >= 0) {
    fsdp::checkpoint::TrainerState state;
    state.step = step;
    fsdp::checkpoint::save(dir + "/ckpt", 1, parts, state, *world);
  }
  std::vector<torch::Tensor> tensors;
  for (auto* model : {static_cast<nn::Module*>(g.get()), static_cast<nn::Module*>(d.get())}) {
    if (way == "fully_shard") {
      for (const auto& [name, t] : fsdp::full_parameters(*model)) tensors.push_back(t);
    } else {
      for (const auto& p : model->parameters()) tensors.push_back(p.detach());
    }
  }
  for (const auto& b : buffers(g, d)) tensors.push_back(b);
  check_bf16_compute = false;
  if (rank == 0) torch::save(tensors, dir + "/" + way + (bf16 ? "_bf16" : "") + "_w" + std::to_string(w) + ".pt");
  // A forward in eval mode reads the buffers and moves none: under
  // replicate it starts from rank 0's.
  g->eval();
  d->eval();
  {
    torch::NoGradGuard no_grad;
    fsdp::call(d, fsdp::call(g, batch(0).noise.narrow(0, rank * rows, rows)));
  }
  torch::save(buffers(g, d), dir + "/" + way + "_buffers_rank" + std::to_string(rank) + ".pt");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dcgan: %s\n", fsdp::error_text(e).c_str());
    return 1;
  }
}

