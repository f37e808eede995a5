#include "fsdp/train/host_step.h"

#include <torch/nn/module.h>

#include "fsdp/common/error.h"
#include "fsdp/common/fault_point.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/optim/fused_adamw.h"

namespace fsdp::train {

// [Note: the host step overlapped with backward]
// Under --cpu-offload the optimizer steps on the host, over shards the
// compute device no longer needs. FSDP2 runs that step after backward, all
// of it, while the device waits. Here each unit's update starts as soon as
// its reduced gradient has landed on the host (its reduction's
// gradients_ready hook, [Note: CPU offload]): a worker thread takes the
// units in the order backward finishes them and runs the fused AdamW on
// one core while backward goes on with the units before it. By the end of
// backward only the last units' updates are left.
//
// What must be known before an update starts cannot depend on the whole
// step's gradients:
// - Clipping scales every gradient by clip / ||g||, the norm over all
//   units, known only after backward; AdamW is not linear in g, so an
//   update made before cannot be corrected. With --grad-clip the step
//   stays after backward (config.cpp refuses the two together), and the
//   cost of that is the non-overlapped host step's (docs/memory.md).
// - The loss scaler (fp16) and the spike guard (--skip-spikes) may skip a
//   step after backward: refused together for the same reason.
// - A non-finite gradient is found by the norm after backward, when some
//   units are updated: the run stops there (Trainer::train_step) instead of
//   skipping the step, and resumes from its last checkpoint.
//
// Each unit's update is all or nothing: a failure in one (FSDP_FAULT_POINT
// train.host_step:THROW injects one) leaves the units queued after it
// untouched, and finish() rethrows it; the trainer then agrees on it with
// every rank before any rank goes on.

OverlappedHostStep::OverlappedHostStep(torch::nn::Module& model, optim::FusedAdamW& optimizer)
    : model_(model), optimizer_(optimizer), worker_([this] { run(); }) {
  set_gradients_ready_hook(model_, [this](const GradientsReady& ready) { on_ready(ready); });
}

OverlappedHostStep::~OverlappedHostStep() {
  try {
    set_gradients_ready_hook(model_, GradientsReadyHook{});
  } catch (const std::exception&) {
    // the model's units are gone already: nothing left to call us
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

void OverlappedHostStep::arm() {
  std::lock_guard<std::mutex> lock(mutex_);
  FSDP_ASSERT(queue_.empty() && running_ == 0);
  armed_ = true;
  stepped_ = 0;
  seen_.clear();
  failure_ = nullptr;
}

void OverlappedHostStep::on_ready(const GradientsReady& ready) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;
  for (const auto& p : ready.params) {
    // A unit reduced twice in one backward (gathered again after its
    // post-backward) would be updated twice.
    FSDP_CHECK(seen_.insert(p.unsafeGetTensorImpl()).second,
               "--overlap-host-step: a unit's gradients were reduced twice in one backward (a unit used again "
               "after its backward); its update cannot start early: drop --overlap-host-step");
  }
  queue_.push_back(ready);
  changed_.notify_all();
}

void OverlappedHostStep::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    GradientsReady unit = std::move(queue_.front());
    queue_.pop_front();
    if (failure_) continue;  // after a failure nothing more is updated
    ++running_;
    lock.unlock();
    std::exception_ptr failed;
    try {
      if (unit.wait_until_readable) unit.wait_until_readable();
      fault_point("train.host_step");
      optimizer_.step_params(unit.params, 1.0, /*serial=*/true);
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    --running_;
    if (failed && !failure_) failure_ = failed;
    if (!failed) stepped_ += unit.params.size();
    changed_.notify_all();
  }
}

size_t OverlappedHostStep::finish() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return queue_.empty() && running_ == 0; });
  armed_ = false;
  if (failure_) std::rethrow_exception(failure_);
  return stepped_;
}

}  // namespace fsdp::train
