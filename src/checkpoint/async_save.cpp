#include "fsdp/checkpoint/async_save.h"

#include <chrono>
#include <numeric>
#include <vector>

#include "fsdp/distributed/collectives.h"

#include "checkpoint/snapshot.h"

namespace fsdp::checkpoint {

AsyncSaver::AsyncSaver(dist::World& world) : world_(world) {
  std::vector<int> all(static_cast<size_t>(world.size()));
  std::iota(all.begin(), all.end(), 0);
  // Gloo whatever the world's backend: the writes agree over host tensors.
  group_ = world.new_group("checkpoint-async", all, "", dist::Backend::kGloo);
}

AsyncSaver::~AsyncSaver() {
  if (worker_.joinable()) worker_.join();
}

void AsyncSaver::save(const std::string& dir, int keep, const Parts& parts, const TrainerState& state) {
  wait();
  std::shared_ptr<const detail::Snapshot> snap = detail::agreed_snapshot(parts, state, world_, /*copy=*/true);
  path_.clear();
  error_ = nullptr;
  worker_ = std::thread([this, dir, keep, snap] {
    const dist::OutOfBandCollectives out_of_band;
    const auto start = std::chrono::steady_clock::now();
    try {
      path_ = detail::write_snapshot(dir, keep, *snap, *group_);
    } catch (...) {
      error_ = std::current_exception();
    }
    write_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
}

std::optional<std::string> AsyncSaver::wait() {
  if (!worker_.joinable()) return std::nullopt;
  worker_.join();
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
  return path_;
}

}  // namespace fsdp::checkpoint
