#pragma once
// Collectives through shared memory, for groups whose members all run on one
// host. The transport reads and writes host tensors; device tensors reach it
// through host staging (src/distributed/host_staging.h). See [Note: shared-memory collectives] in
// shared_memory.cpp.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include "fsdp/distributed/collectives.h"

namespace c10d {
class Store;
class Work;
}  // namespace c10d

namespace fsdp::dist {

class SharedMemoryTransport {
 public:
  // Most members a group may have here.
  static constexpr int kMaxMembers = 64;
  // Bytes each member may place in the segment per round, in each of its
  // two buffers (a larger message moves in rounds of this size): 2 MiB,
  // less in large groups, so that a segment stays within 32 MiB.
  static int64_t default_round_bytes(int size);

  // Maps one segment for the group's `size` members, agreeing through
  // `store` (a store private to the group). Returns null on every member
  // when any member cannot map it (another host, another /dev/shm, no space
  // there) or does not want it (`wanted` false); `why` then says which.
  // Collective over the group: every member calls it, wanted or not.
  // Throws when the agreement itself fails (a peer died meanwhile).
  // round_bytes 0: default_round_bytes(size).
  static std::unique_ptr<SharedMemoryTransport> connect(c10d::Store& store, int rank, int size, bool wanted,
                                                        std::string* why, int64_t round_bytes = 0);
  ~SharedMemoryTransport();
  SharedMemoryTransport(const SharedMemoryTransport&) = delete;
  SharedMemoryTransport& operator=(const SharedMemoryTransport&) = delete;

  // Element types reduce_scatter and all_reduce can reduce; gathers and
  // broadcasts move bytes of any type.
  static bool reduces(at::ScalarType type, bool floating_only);

  // The same contracts as the functions of collectives.h, each finished by
  // this transport's thread in the order the group issued them.
  c10::intrusive_ptr<c10d::Work> all_gather(const at::Tensor& output, const at::Tensor& input);
  c10::intrusive_ptr<c10d::Work> reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op);
  c10::intrusive_ptr<c10d::Work> all_reduce(const at::Tensor& tensor, ReduceOp op);
  c10::intrusive_ptr<c10d::Work> broadcast(const at::Tensor& tensor, int root);
  c10::intrusive_ptr<c10d::Work> barrier();

  // Rounds this member has completed, for tests: read after waiting on a
  // collective of this transport.
  uint32_t rounds() const;

  struct Op;

 private:
  SharedMemoryTransport(int rank, int size, int fd, void* base, int64_t mapped, int64_t round_bytes);
  c10::intrusive_ptr<c10d::Work> submit(std::shared_ptr<Op> op);
  void progress_loop();
  void run(Op& op);
  // One round: the caller's bytes are in its buffer once `write` returns;
  // `read` runs when every member has written.
  template <typename Write, typename Read>
  void round(const uint64_t* description, Write&& write, Read&& read);
  void wait_until(const char* what, const std::function<bool()>& ready);
  std::string dead_member() const;
  // The 32-bit counter at `offset` in the segment.
  std::atomic<uint32_t>* word(int64_t offset) const {
    return reinterpret_cast<std::atomic<uint32_t>*>(base_ + offset);
  }

  int rank_;
  int size_;
  int fd_;
  char* base_;
  int64_t mapped_;
  int64_t round_bytes_;
  uint32_t rounds_ = 0;  // completed by this member; the same count on every member

  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<std::shared_ptr<Op>> queue_;
  std::atomic<bool> stopping_{false};
  std::string broken_;  // why the group can take no more collectives
  std::thread thread_;
};

}  // namespace fsdp::dist
