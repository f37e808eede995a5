#pragma once
// What a checkpoint holds, part by part (torchtitan's CheckpointManager over
// Stateful parts): models with their buffers, optimizers with their
// per-parameter state and hyperparameters, and whatever else the program
// keeps (LR schedulers, where its data stands, its own counters) as JSON.
//
//   fsdp::checkpoint::Parts parts;
//   parts.model("generator", *gen).model("discriminator", *disc)
//        .optimizer("generator_adam", gen_adam).optimizer("discriminator_adam", disc_adam)
//        .state("generator_schedule", gen_schedule);
//   fsdp::checkpoint::save(dir, /*keep=*/2, parts, state, *world);
//
// Names are the program's: a load matches parts by name, so a program reads
// its checkpoints back with the same names. A model named "" keeps its
// parameters' own names (the trainer's, and what an export reads); others
// prefix theirs with "<name>.".

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

namespace fsdp::checkpoint {

// A part of the program's state held as JSON (torch's Stateful).
class Stateful {
 public:
  virtual ~Stateful() = default;
  virtual nlohmann::json state_dict() const = 0;
  // Throws fsdp::Error naming what is wrong with `state`.
  virtual void load_state_dict(const nlohmann::json& state) = 0;
};

// A LibTorch LR scheduler (StepLR, or one of the program's own deriving from
// torch::optim::LRScheduler): its step count. The learning rates it set are
// the optimizer's hyperparameters, saved with the optimizer.
class SchedulerState : public Stateful {
 public:
  explicit SchedulerState(torch::optim::LRScheduler& scheduler) : scheduler_(scheduler) {}
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 private:
  torch::optim::LRScheduler& scheduler_;
};

// A JSON object the program keeps and updates itself (its data position,
// its counters): saved as it is at the save, replaced at the load.
class JsonState : public Stateful {
 public:
  explicit JsonState(nlohmann::json& value) : value_(value) {}
  nlohmann::json state_dict() const override { return value_; }
  void load_state_dict(const nlohmann::json& state) override { value_ = state; }

 private:
  nlohmann::json& value_;
};

struct Parts {
  Parts& model(std::string name, torch::nn::Module& module) {
    models.emplace_back(std::move(name), &module);
    return *this;
  }
  Parts& optimizer(std::string name, torch::optim::Optimizer& optimizer) {
    optimizers.emplace_back(std::move(name), &optimizer);
    return *this;
  }
  Parts& state(std::string name, Stateful& part) {
    states.emplace_back(std::move(name), &part);
    return *this;
  }
  // Parameters that do not require gradients are neither saved nor loaded:
  // the program rebuilds them as it started (a LoRA run's frozen base, read
  // from its files again), and a checkpoint holds the trained ones alone.
  // The checkpoint records it; loading one into parts without it is refused,
  // and these parts load their trainable parameters from a full checkpoint too.
  Parts& leave_out_frozen() {
    frozen_left_out = true;
    return *this;
  }

  std::vector<std::pair<std::string, torch::nn::Module*>> models;
  std::vector<std::pair<std::string, torch::optim::Optimizer*>> optimizers;
  std::vector<std::pair<std::string, Stateful*>> states;
  bool frozen_left_out = false;
};

}  // namespace fsdp::checkpoint
