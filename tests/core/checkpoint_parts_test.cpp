// Checkpoints of any state (checkpoint/parts.h) at the test world's size:
// each LibTorch optimizer kind, with the BatchNorm buffers beside it, saved
// mid-run and loaded into a fresh program continues exactly as the run
// that never stopped; a checkpoint of other parts is refused naming both
// sides, on every rank, before anything is read.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fsdp/checkpoint/async_save.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/optimizer_state.h"
#include "fsdp/checkpoint/state_dict.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp_test_support.h"

namespace fsdp::testing::checkpoint_parts_test {
namespace {

struct NormNetImpl : torch::nn::Module {
  NormNetImpl() : in(5, 8), norm(8), out(8, 3) {
    register_module("in", in);
    register_module("norm", norm);
    register_module("out", out);
  }
  torch::Tensor forward(const torch::Tensor& x) { return out(torch::relu(norm(in(x)))); }
  torch::nn::Linear in;
  torch::nn::BatchNorm1d norm;
  torch::nn::Linear out;
};
TORCH_MODULE(NormNet);

NormNet make_sharded_net() {
  torch::manual_seed(7);
  NormNet net;
  FullyShardOptions options;
  options.mesh = mesh_for(ShardingStrategy::kFullShard);
  fully_shard(net, options);
  return net;
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

// One step on this rank's 4 rows of the step's batch.
void train_step(NormNet& net, torch::optim::Optimizer& optimizer, int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(40 + step * 100 + test_world().rank());
  const torch::Tensor x = torch::randn({4, 5}, gen), y = torch::randn({4, 3}, gen);
  optimizer.zero_grad();
  torch::mse_loss(call(net, x), y).backward();
  optimizer.step();
}

std::string shared_dir(const std::string& name) {
  const std::string dir = std::filesystem::temp_directory_path().string() + "/fsdp-parts-" + name + "-" +
                          std::to_string(test_world().size()) + "-" + std::getenv("MASTER_PORT");
  if (test_world().rank() == 0) std::filesystem::remove_all(dir);
  dist::barrier(test_world().group());
  return dir;
}

std::vector<torch::Tensor> state_of(NormNet& net) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, t] : full_parameters(*net)) out.push_back(t);
  for (const auto& b : net->buffers()) out.push_back(b.clone());
  return out;
}

const std::vector<std::pair<std::string, MakeOptimizer>>& optimizer_kinds() {
  using namespace torch::optim;
  static const std::vector<std::pair<std::string, MakeOptimizer>> kinds = {
      {"sgd_nesterov", [](auto p) { return std::make_unique<SGD>(p, SGDOptions(0.05).momentum(0.9).nesterov(true)); }},
      {"adam_amsgrad", [](auto p) { return std::make_unique<Adam>(p, AdamOptions(0.01).amsgrad(true)); }},
      {"adamw", [](auto p) { return std::make_unique<AdamW>(p, AdamWOptions(0.01)); }},
      {"rmsprop_centered",
       [](auto p) { return std::make_unique<RMSprop>(p, RMSpropOptions(0.01).momentum(0.5).centered(true)); }},
      {"adagrad", [](auto p) { return std::make_unique<Adagrad>(p, AdagradOptions(0.05).lr_decay(0.01)); }},
  };
  return kinds;
}

TEST(CheckpointParts, EveryOptimizerKindAndTheBuffersResumeExactly) {
  for (const auto& [kind, make] : optimizer_kinds()) {
    SCOPED_TRACE(kind);
    const std::string dir = shared_dir(kind);
    auto net = make_sharded_net();
    auto optimizer = make(unique_parameters(*net));
    for (int64_t step = 0; step < 2; ++step) train_step(net, *optimizer, step);
    checkpoint::TrainerState state;
    state.step = 2;
    checkpoint::save(dir, 1, *net, *optimizer, state, test_world());
    for (int64_t step = 2; step < 4; ++step) train_step(net, *optimizer, step);
    const auto uninterrupted = state_of(net);

    auto resumed = make_sharded_net();
    auto fresh = make(unique_parameters(*resumed));
    fresh->param_groups()[0].options().set_lr(123.0);  // the saved rate must come back, not this one
    const auto loaded = checkpoint::load(*checkpoint::latest(dir), *resumed, *fresh, test_world());
    EXPECT_EQ(loaded.step, 2);
    EXPECT_EQ(loaded.sharding, "full_shard");
    for (int64_t step = 2; step < 4; ++step) train_step(resumed, *fresh, step);
    const auto after = state_of(resumed);
    ASSERT_EQ(after.size(), uninterrupted.size());
    // Buffers are rank 0's in a checkpoint ([Note: buffers under
    // fully_shard]): the other ranks' own statistics do not come back.
    const size_t compared = test_world().rank() == 0 ? after.size() : after.size() - 3;
    for (size_t i = 0; i < compared; ++i) {
      EXPECT_TRUE(torch::equal(after[i], uninterrupted[i])) << "tensor " << i << " (the last three are buffers)";
    }
    // Something trained and something moved the statistics.
    EXPECT_GT(resumed->norm->num_batches_tracked.item<int64_t>(), 2);
  }
}

// A program whose first layer is frozen, as a LoRA run's base is.
NormNet make_half_frozen_net(uint64_t seed) {
  torch::manual_seed(seed);
  NormNet net;
  for (auto& p : net->in->parameters()) p.requires_grad_(false);
  FullyShardOptions options;
  options.mesh = mesh_for(ShardingStrategy::kFullShard);
  fully_shard(net, options);
  return net;
}

std::vector<torch::Tensor> trainable_of(NormNet& net) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net->parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

TEST(CheckpointParts, LeftOutFrozenParametersAreNeitherSavedNorLoaded) {
  const std::string dir = shared_dir("frozen");
  auto net = make_half_frozen_net(7);
  auto optimizer = std::make_unique<torch::optim::AdamW>(trainable_of(net), torch::optim::AdamWOptions(0.01));
  for (int64_t step = 0; step < 2; ++step) train_step(net, *optimizer, step);
  checkpoint::TrainerState state;
  state.step = 2;
  const auto parts = [](NormNet& n, torch::optim::Optimizer& o) {
    return checkpoint::Parts().model("", *n).optimizer("adamw", o).leave_out_frozen();
  };
  checkpoint::save(dir, 1, parts(net, *optimizer), state, test_world());
  for (int64_t step = 2; step < 4; ++step) train_step(net, *optimizer, step);
  const auto uninterrupted = state_of(net);

  const std::string path = *checkpoint::latest(dir);
  const auto meta = checkpoint::read_metadata(path);
  EXPECT_TRUE(meta.value("frozen_left_out", false));
  for (const auto& [fqn, unused] : meta["params"].items()) {
    EXPECT_NE(fqn.rfind("in.", 0), 0u) << fqn << ": a frozen parameter was saved";
  }
  EXPECT_EQ(meta["params"].size(), 4u) << "norm and out, weight and bias";

  // A program with the same frozen layer and other trainable values: the
  // load brings the trainable ones and their state, and it continues as
  // the run that never stopped.
  auto resumed = make_half_frozen_net(7);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : trainable_of(resumed)) p.fill_(0.25);
  }
  auto fresh = std::make_unique<torch::optim::AdamW>(trainable_of(resumed), torch::optim::AdamWOptions(0.01));
  checkpoint::load(path, parts(resumed, *fresh), test_world());
  for (int64_t step = 2; step < 4; ++step) train_step(resumed, *fresh, step);
  const auto after = state_of(resumed);
  ASSERT_EQ(after.size(), uninterrupted.size());
  const size_t compared = test_world().rank() == 0 ? after.size() : after.size() - 3;  // buffers: rank 0's
  for (size_t i = 0; i < compared; ++i) EXPECT_TRUE(torch::equal(after[i], uninterrupted[i])) << "tensor " << i;

  // The frozen layer is the program's own: another one stays as it is.
  auto other = make_half_frozen_net(8);
  const auto frozen_before = full_parameters(*other->in);
  auto other_optimizer = std::make_unique<torch::optim::AdamW>(trainable_of(other), torch::optim::AdamWOptions(0.01));
  checkpoint::load(path, parts(other, *other_optimizer), test_world());
  const auto frozen_after = full_parameters(*other->in);
  for (size_t i = 0; i < frozen_before.size(); ++i) {
    EXPECT_TRUE(torch::equal(frozen_before[i].second, frozen_after[i].second)) << frozen_before[i].first;
  }

  // Parts that expect every parameter are refused, naming the way to load it.
  auto whole = make_half_frozen_net(7);
  auto whole_optimizer = std::make_unique<torch::optim::AdamW>(trainable_of(whole), torch::optim::AdamWOptions(0.01));
  try {
    checkpoint::load(path, checkpoint::Parts().model("", *whole).optimizer("adamw", *whole_optimizer), test_world());
    ADD_FAILURE() << "a checkpoint without its frozen parameters loaded into parts that expect them";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Parts::leave_out_frozen"), std::string::npos) << e.what();
  }
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(AsyncSave, WritesTheStateAtTheSaveWhileTrainingGoesOn) {
  for (const char* kind : {"sgd_nesterov", "adamw"}) {
    SCOPED_TRACE(kind);
    const auto& make = std::find_if(optimizer_kinds().begin(), optimizer_kinds().end(),
                                    [&](const auto& k) { return k.first == kind; })->second;
    const std::string sync_dir = shared_dir(std::string("sync-") + kind);
    const std::string async_dir = shared_dir(std::string("async-") + kind);
    checkpoint::AsyncSaver saver(test_world());
    auto net = make_sharded_net();
    auto optimizer = make(unique_parameters(*net));
    const auto parts = checkpoint::Parts().model("", *net).optimizer("optimizer", *optimizer);
    for (int64_t step = 0; step < 2; ++step) train_step(net, *optimizer, step);
    checkpoint::TrainerState state;
    state.step = 2;
    checkpoint::save(sync_dir, 2, parts, state, test_world());
    saver.save(async_dir, 2, parts, state);
    EXPECT_TRUE(saver.in_flight());
    // Training goes on (its collectives on the world's group) while the
    // save writes and agrees over its own; the parameters and the moments
    // change under it.
    for (int64_t step = 2; step < 4; ++step) train_step(net, *optimizer, step);
    const auto uninterrupted = state_of(net);
    ASSERT_EQ(saver.wait(), async_dir + "/step_00000002");
    EXPECT_FALSE(saver.in_flight());
    EXPECT_EQ(saver.wait(), std::nullopt);
    // File for file what a save at that moment writes: the state at step 2,
    // not what the program holds by the time the files are written.
    for (const auto& entry : std::filesystem::directory_iterator(sync_dir + "/step_00000002")) {
      const std::string name = entry.path().filename().string();
      EXPECT_EQ(bytes_of(entry.path().string()), bytes_of(async_dir + "/step_00000002/" + name)) << name;
    }
    EXPECT_EQ(bytes_of(async_dir + "/latest"), "step_00000002\n");

    auto resumed = make_sharded_net();
    auto fresh = make(unique_parameters(*resumed));
    EXPECT_EQ(checkpoint::load(*checkpoint::latest(async_dir), *resumed, *fresh, test_world()).step, 2);
    for (int64_t step = 2; step < 4; ++step) train_step(resumed, *fresh, step);
    const auto after = state_of(resumed);
    const size_t compared = test_world().rank() == 0 ? after.size() : after.size() - 3;  // buffers: rank 0's
    for (size_t i = 0; i < compared; ++i) EXPECT_TRUE(torch::equal(after[i], uninterrupted[i])) << "tensor " << i;

    // A save while one is in flight waits for it; `latest` moves to the newer.
    state.step = 4;
    saver.save(async_dir, 2, parts, state);
    state.step = 5;
    saver.save(async_dir, 2, parts, state);
    EXPECT_EQ(saver.wait(), async_dir + "/step_00000005");
    EXPECT_EQ(bytes_of(async_dir + "/latest"), "step_00000005\n");
    EXPECT_TRUE(std::filesystem::is_directory(async_dir + "/step_00000004"));
    EXPECT_FALSE(std::filesystem::exists(async_dir + "/step_00000002")) << "keep = 2";
  }
}

TEST(AsyncSave, AFailedWriteIsReportedByWaitOnEveryRankAndTheSaverGoesOn) {
  const std::string dir = shared_dir("async-fails");
  checkpoint::AsyncSaver saver(test_world());
  auto net = make_sharded_net();
  torch::optim::SGD optimizer(unique_parameters(*net), torch::optim::SGDOptions(0.1));
  const auto parts = checkpoint::Parts().model("", *net).optimizer("optimizer", optimizer);
  checkpoint::TrainerState state;
  state.step = 1;
  saver.save(dir + "/ckpt", 1, parts, state);
  ASSERT_TRUE(saver.wait().has_value());
  // A folder that cannot be made: a file stands where it goes.
  if (test_world().rank() == 0) std::ofstream(dir + "/file") << "in the way";
  dist::barrier(test_world().group());
  state.step = 2;
  saver.save(dir + "/file/ckpt", 1, parts, state);
  try {
    saver.save(dir + "/ckpt", 1, parts, state);  // waits for the failed one first, and says so
    ADD_FAILURE() << "the save did not fail";
  } catch (const checkpoint::SaveError& e) {
    EXPECT_NE(std::string(e.what()).find("failed on rank 0"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(saver.in_flight()) << "the save after a failed one is not started";
  EXPECT_EQ(bytes_of(dir + "/ckpt/latest"), "step_00000001\n");
  state.step = 3;
  saver.save(dir + "/ckpt", 1, parts, state);
  EXPECT_EQ(saver.wait(), dir + "/ckpt/step_00000003");
}

TEST(CheckpointParts, AnotherProgramsCheckpointIsRefusedNamingBothSides) {
  const std::string dir = shared_dir("refused");
  auto net = make_sharded_net();
  torch::optim::SGD sgd(unique_parameters(*net), torch::optim::SGDOptions(0.1).momentum(0.9));
  train_step(net, sgd, 0);
  nlohmann::json counters = {{"seen", 4}};
  checkpoint::JsonState program(counters);
  checkpoint::save(dir, 1, checkpoint::Parts().model("", *net).optimizer("optimizer", sgd).state("program", program),
                   {}, test_world());
  const std::string saved = *checkpoint::latest(dir);

  auto other = make_sharded_net();
  torch::optim::Adam adam(unique_parameters(*other));
  expect_error_on_every_rank([&] { checkpoint::load(saved, *other, adam, test_world()); },
                             {"optimizer 'optimizer' was saved from sgd, this program's is adam"});
  torch::optim::SGD other_sgd(unique_parameters(*other), torch::optim::SGDOptions(0.1));
  expect_error_on_every_rank(
      [&] { checkpoint::load(saved, checkpoint::Parts().model("", *other).optimizer("sgd", other_sgd), test_world()); },
      {"holds no optimizer 'sgd' (it holds 'optimizer')"});
  expect_error_on_every_rank(
      [&] { checkpoint::load(saved, checkpoint::Parts().model("", *other).state("data", program), test_world()); },
      {"holds no state 'data'"});
  expect_error_on_every_rank(
      [&] { checkpoint::load(saved, checkpoint::Parts().model("net", *other), test_world()); },
      {"has no parameter 'net.in.weight'"});
  // A model with a buffer the checkpoint lacks.
  struct WithBufferImpl : torch::nn::Module {
    WithBufferImpl() { register_buffer("extra", torch::zeros({2})); }
  };
  auto extended = make_sharded_net();
  extended->register_module("tail", std::make_shared<WithBufferImpl>());
  expect_error_on_every_rank([&] { checkpoint::load(saved, checkpoint::Parts().model("", *extended), test_world()); },
                             {"has no buffer 'tail.extra', which this model has"});
  // A checkpoint holding what this model lacks names it: a parameter, and
  // a buffer (it said only how many each side has before).
  const std::string wider_dir = shared_dir("refused_wider");
  {
    torch::manual_seed(7);
    NormNet wider;
    wider->register_module("tail", torch::nn::Linear(3, 2));
    FullyShardOptions options;
    options.mesh = mesh_for(ShardingStrategy::kFullShard);
    fully_shard(wider, options);
    checkpoint::save(wider_dir, 1, checkpoint::Parts().model("", *wider), {}, test_world());
  }
  expect_error_on_every_rank(
      [&] { checkpoint::load(*checkpoint::latest(wider_dir), checkpoint::Parts().model("", *other), test_world()); },
      {"holds parameter 'tail.", "', which this model has not"});
  const std::string buffered_dir = shared_dir("refused_buffered");
  checkpoint::save(buffered_dir, 1, checkpoint::Parts().model("", *extended), {}, test_world());
  expect_error_on_every_rank(
      [&] { checkpoint::load(*checkpoint::latest(buffered_dir), checkpoint::Parts().model("", *other), test_world()); },
      {"holds buffer 'tail.extra', which this model has not"});
  // The program's own state comes back as saved.
  counters = {{"seen", 0}};
  auto same = make_sharded_net();
  torch::optim::SGD same_sgd(unique_parameters(*same), torch::optim::SGDOptions(0.1).momentum(0.9));
  checkpoint::load(saved, checkpoint::Parts().model("", *same).optimizer("optimizer", same_sgd).state("program", program),
                   test_world());
  EXPECT_EQ(counters.at("seen").get<int>(), 4);
}

// FSDP2's full state dict: gathered, written once by rank 0, loaded into
// an unsharded module (every parameter whole) and into a sharded one (each
// rank's ranges), equal to what the trained module holds.
TEST(StateDict, AFullStateDictLoadsIntoAnUnshardedModuleAndIntoShards) {
  const std::string dir = shared_dir("state-dict");
  if (test_world().rank() == 0) std::filesystem::create_directories(dir);
  dist::barrier(test_world().group());
  auto net = make_sharded_net();
  torch::optim::SGD sgd(unique_parameters(*net), torch::optim::SGDOptions(0.1));
  train_step(net, sgd, 0);
  const std::string path = dir + "/model.safetensors";
  checkpoint::save_full_state_dict(*net, path, test_world());
  const auto full = full_parameters(*net);

  torch::manual_seed(99);  // other weights, which the load replaces
  NormNet plain;
  checkpoint::load_full_state_dict(*plain, path);
  const auto plain_params = plain->named_parameters();
  ASSERT_EQ(plain_params.size(), full.size());
  for (const auto& [name, value] : full) {
    EXPECT_TRUE(torch::equal(plain_params[name], value)) << name;
  }
  if (test_world().rank() == 0) {  // the file holds rank 0's buffers
    EXPECT_TRUE(torch::equal(plain->norm->running_mean, net->norm->running_mean));
    EXPECT_EQ(plain->norm->num_batches_tracked.item<int64_t>(), 1);
  }

  auto resharded = make_sharded_net();
  checkpoint::load_full_state_dict(*resharded, path);
  const auto expected = local_shards(*net), actual = local_shards(*resharded);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_TRUE(torch::equal(actual[i].local, expected[i].local)) << actual[i].fqn;
  }

  // Another module's file: refused naming the key and both sides, nothing written.
  const std::string bad = dir + "/bad_rank" + std::to_string(test_world().rank()) + ".safetensors";
  const auto write = [&](const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
    std::vector<io::SafetensorsWriter::Spec> specs;
    for (const auto& [name, t] : tensors) specs.push_back({name, t.scalar_type(), t.sizes().vec()});
    io::SafetensorsWriter writer(bad, specs);
    for (const auto& [name, t] : tensors) writer.write(t);
    writer.commit();
  };
  auto tensors = checkpoint::full_state_dict(*plain);
  const auto before = plain->in->weight.clone();
  auto reshaped = tensors;
  reshaped[0].second = torch::zeros({3, 3});
  write(reshaped);
  expect_error_on_every_rank([&] { checkpoint::load_full_state_dict(*plain, bad); },
                             {"'in.weight' has shape [3, 3], the module's is [8, 5]"});
  auto missing = tensors;
  missing.erase(missing.begin());
  write(missing);
  expect_error_on_every_rank([&] { checkpoint::load_full_state_dict(*plain, bad); },
                             {"has no 'in.weight', which the module has (shape [8, 5])"});
  auto extra = tensors;
  extra.emplace_back("head.weight", torch::zeros({2}));
  write(extra);
  expect_error_on_every_rank([&] { checkpoint::load_full_state_dict(*plain, bad); },
                             {"holds 'head.weight' (shape [2]), which the module does not have"});
  EXPECT_TRUE(torch::equal(plain->in->weight, before)) << "a refused state dict changed the module";
}

TEST(StateDict, TheOptimizersFullStateDictLoadsIntoShardsAndIntoOneProcess) {
  for (const auto& [kind, make] : optimizer_kinds()) {
    SCOPED_TRACE(kind);
    const std::string dir = shared_dir("optim-state-dict-" + kind);
    if (test_world().rank() == 0) std::filesystem::create_directories(dir);
    dist::barrier(test_world().group());
    auto net = make_sharded_net();
    auto optimizer = make(unique_parameters(*net));
    for (int64_t step = 0; step < 2; ++step) train_step(net, *optimizer, step);
    const std::string model_path = dir + "/model.safetensors", optim_path = dir + "/optim.safetensors";
    checkpoint::save_full_state_dict(*net, model_path, test_world());
    checkpoint::save_full_optimizer_state_dict(*net, *optimizer, optim_path, test_world());
    const auto shards = local_shards(*net);
    std::vector<std::vector<std::pair<std::string, torch::Tensor>>> held;  // this rank's state, per shard
    for (const auto& s : shards) {
      auto& copies = held.emplace_back();
      for (const auto& [name, value] :
           checkpoint::read_param_state(checkpoint::optimizer_kind(*optimizer),
                                        *optimizer->state().at(compat::optimizer_state_key(s.param)))
               .tensors) {
        copies.emplace_back(name, value.clone());  // the optimizer updates its own in place
      }
    }
    for (int64_t step = 2; step < 4; ++step) train_step(net, *optimizer, step);
    const auto uninterrupted = state_of(net);

    // A fresh sharded program from the two files continues bit for bit.
    auto resumed = make_sharded_net();
    auto fresh = make(unique_parameters(*resumed));
    fresh->param_groups()[0].options().set_lr(123.0);  // the saved rate comes back
    checkpoint::load_full_state_dict(*resumed, model_path);
    checkpoint::load_full_optimizer_state_dict(*resumed, *fresh, optim_path);
    for (int64_t step = 2; step < 4; ++step) train_step(resumed, *fresh, step);
    const auto after = state_of(resumed);
    const size_t compared = test_world().rank() == 0 ? after.size() : after.size() - 3;  // buffers: rank 0's
    for (size_t i = 0; i < compared; ++i) EXPECT_TRUE(torch::equal(after[i], uninterrupted[i])) << "tensor " << i;

    // One process, unsharded: its state holds, at each shard's range, what
    // that shard's optimizer held.
    NormNet plain;
    auto whole = make(plain->parameters());
    checkpoint::load_full_optimizer_state_dict(*plain, *whole, optim_path);
    EXPECT_EQ(whole->param_groups()[0].options().get_lr(), optimizer->param_groups()[0].options().get_lr());
    const auto plain_params = plain->named_parameters();
    for (size_t i = 0; i < shards.size(); ++i) {
      const auto& s = shards[i];
      const auto state = checkpoint::read_param_state(checkpoint::optimizer_kind(*whole),
                                                      *whole->state().at(compat::optimizer_state_key(plain_params[s.fqn])));
      ASSERT_EQ(state.tensors.size(), held[i].size()) << s.fqn;
      for (size_t t = 0; t < held[i].size(); ++t) {
        EXPECT_EQ(state.tensors[t].first, held[i][t].first);
        EXPECT_TRUE(torch::equal(state.tensors[t].second.reshape({-1}).narrow(0, s.begin, s.numel),
                                 held[i][t].second.reshape({-1})))
            << s.fqn << " " << held[i][t].first;
      }
    }
  }
  // Another optimizer's file: refused naming both, nothing changed.
  const std::string sgd_file = std::filesystem::temp_directory_path().string() + "/fsdp-parts-optim-state-dict-" +
                               "sgd_nesterov-" + std::to_string(test_world().size()) + "-" + std::getenv("MASTER_PORT") +
                               "/optim.safetensors";
  NormNet plain;
  torch::optim::Adam adam(plain->parameters(), torch::optim::AdamOptions(0.5));
  expect_error_on_every_rank(
      [&] { checkpoint::load_full_optimizer_state_dict(*plain, adam, sgd_file); },
      {"was saved from sgd, this optimizer is adam"});
  EXPECT_EQ(adam.param_groups()[0].options().get_lr(), 0.5);
}

}  // namespace
}  // namespace fsdp::testing::checkpoint_parts_test
