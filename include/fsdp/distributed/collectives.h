#pragma once
// The collectives the FSDP core needs, asynchronous with a wait handle.
// Every call is issued by all members of the group in the same order.
//
// Where c10d lacks an operation (Gloo in LibTorch 1.13 has neither
// reduce-scatter nor all-gather into one tensor, and rejects bf16), it is
// built from what Gloo has while keeping each rank's traffic at (W-1)/W of
// the buffer. [Note: reduce-scatter on Gloo] in collectives.cpp explains how.

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include "fsdp/distributed/process_group.h"

namespace fsdp::dist {

enum class ReduceOp { kSum, kAvg, kMax };

// Collectives this thread issues while one lives are outside the job's
// sequence: a background thread's (an async checkpoint's, on a group of its
// own) interleave with the training thread's differently on each rank, so
// they are neither fingerprinted nor checked ([Note: desync checks]), nor
// counted as time the training waited.
class OutOfBandCollectives {
 public:
  OutOfBandCollectives();
  ~OutOfBandCollectives();
  OutOfBandCollectives(const OutOfBandCollectives&) = delete;
  OutOfBandCollectives& operator=(const OutOfBandCollectives&) = delete;
};

// Handle to one issued collective. wait() blocks until it is done (or the
// group's timeout passes), then runs the finishing step (unpacking, local
// reduction); failures surface as fsdp::Error naming the operation and group.
// Calling wait() again is a no-op. Dropping an unwaited handle waits.
class Work {
 public:
  Work() = default;
  Work(std::string op, ProcessGroup* group, std::vector<c10::intrusive_ptr<c10d::Work>> pending,
       std::function<void()> finish, int64_t seq = 0);
  // A moved-from handle is done: only the new owner waits.
  Work(Work&& other) noexcept;
  Work& operator=(Work&&) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();

  void wait();
  bool done() const { return done_; }
  // This handle, with `more` run after its own finishing step.
  Work and_then(std::function<void()> more) &&;

 private:
  std::string op_;
  ProcessGroup* group_ = nullptr;
  std::vector<c10::intrusive_ptr<c10d::Work>> pending_;
  std::function<void()> finish_;
  int64_t seq_ = 0;  // in the flight recorder
  bool done_ = true;
};

// output (W * n elements, contiguous) <- every rank's input (n elements),
// rank i's at [i*n, (i+1)*n).
Work all_gather_into_tensor(ProcessGroup& group, const at::Tensor& output, const at::Tensor& input);

// output (n elements) <- op over ranks of input[rank*n, (rank+1)*n), where
// input holds W * n elements. Half-precision inputs are reduced in fp32.
// Buffers the backend needs besides input and output (Gloo's receive
// buffer) are counted as communication memory until the handle is waited.
Work reduce_scatter_tensor(ProcessGroup& group, const at::Tensor& output, const at::Tensor& input,
                           ReduceOp op = ReduceOp::kSum);

// In place. Half-precision tensors are reduced in fp32.
Work all_reduce(ProcessGroup& group, const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);

// In place, from `root` (a rank of the group).
Work broadcast(ProcessGroup& group, const at::Tensor& tensor, int root);

void barrier(ProcessGroup& group);


// Sharding arithmetic: a flat buffer of `numel` elements is padded to a
// multiple of `world` and split into equal shards.
int64_t padded_numel(int64_t numel, int world);
int64_t shard_numel(int64_t numel, int world);

}  // namespace fsdp::dist
