#pragma once
// The optimizer's step on the host, unit by unit, while backward goes on
// (--overlap-host-step under --cpu-offload): see [Note: the host step
// overlapped with backward] in src/train/host_step.cpp.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "fsdp/core/options.h"

namespace torch::nn {
class Module;
}

namespace fsdp::optim {
class FusedAdamW;
}

namespace fsdp::train {

class OverlappedHostStep {
 public:
  // Hooks every unit under `model` (set_gradients_ready_hook); the steps
  // run on a worker thread of its own, through `optimizer`.
  OverlappedHostStep(torch::nn::Module& model, optim::FusedAdamW& optimizer);
  ~OverlappedHostStep();  // unhooks, and joins the worker after its queue
  OverlappedHostStep(const OverlappedHostStep&) = delete;
  OverlappedHostStep& operator=(const OverlappedHostStep&) = delete;

  // The next backward is the step's synchronised one: each unit's update
  // starts once its gradients are ready. Backward passes without arming
  // (micro-steps that only accumulate) step nothing.
  void arm();
  // Waits for every unit's update queued since arm(), and disarms. Throws
  // the first failure of one (the others queued behind it are not run, so
  // each unit's shard is either updated whole or not at all). Returns the
  // number of parameters updated.
  size_t finish();

 private:
  void on_ready(const GradientsReady& ready);
  void run();

  torch::nn::Module& model_;
  optim::FusedAdamW& optimizer_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<GradientsReady> queue_;
  size_t running_ = 0;  // units taken from the queue and not yet done
  size_t stepped_ = 0;  // parameters updated since arm()
  std::unordered_set<const void*> seen_;  // parameters queued since arm()
  std::exception_ptr failure_;
  bool armed_ = false;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace fsdp::train
