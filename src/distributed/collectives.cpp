#include "fsdp/distributed/collectives.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <cstdio>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "fsdp/common/buffer_accounting.h"
#include "fsdp/common/error.h"
#include "fsdp/common/flat_buffer.h"
#include "fsdp/common/error_text.h"
#include "fsdp/distributed/desync.h"
#include "fsdp/distributed/flight_recorder.h"
#include "distributed/host_staging.h"
#include "distributed/shared_memory.h"

namespace fsdp::dist {
namespace {

// [Note: reduce-scatter on Gloo]
// Gloo (LibTorch 1.13) has no reduce-scatter. An all-reduce of the whole
// buffer would move 2(W-1)/W of it per rank and leave W copies of the sum.
// Instead, one all-to-all sends chunk j of every rank's input to rank j
// ((W-1)/W of the buffer out and in, the same as a ring reduce-scatter), and
// rank j sums the W chunks it received locally. Half-precision chunks travel
// as raw bytes (Gloo rejects bf16) and are summed in fp32, then rounded once.

bool is_half(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

// Gloo refuses some dtypes (bf16) even where no arithmetic happens; bytes
// always travel.
at::Tensor as_bytes(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

c10d::ReduceOp c10d_op(ReduceOp op, Backend backend) {
  // NCCL averages natively; on Gloo we sum and divide once at the end.
  if (op == ReduceOp::kMax) return c10d::ReduceOp::MAX;
  if (op == ReduceOp::kAvg && backend == Backend::kNccl) return c10d::ReduceOp::AVG;
  return c10d::ReduceOp::SUM;
}

bool divide_after(ReduceOp op, Backend backend) { return op == ReduceOp::kAvg && backend != Backend::kNccl; }

// [Note: host tensors on NCCL]
// NCCL moves only device memory, but small host tensors are the natural
// currency of control decisions (a stop flag, a loss to average, a
// checkpoint's agreement). A host tensor given to a collective on an NCCL
// group travels through a copy on the current CUDA device, and the result is
// copied back when the work is waited for; FSDP's own buffers are already on
// the device and never take this path.
bool staged_through_device(ProcessGroup& group, const at::Tensor& t) {
  return group.backend() == Backend::kNccl && t.is_cpu();
}

at::Tensor on_comm_device(ProcessGroup& group, const at::Tensor& t) {
  return staged_through_device(group, t) ? t.to(at::Device(at::kCUDA)) : t;
}

void check_flat(const at::Tensor& t, const char* op, const char* which) {
  FSDP_CHECK(t.defined() && t.is_contiguous(), op, ": ", which, " must be a defined, contiguous tensor");
}

template <typename IssueFn>
c10::intrusive_ptr<c10d::Work> issue(const char* op, ProcessGroup& group, IssueFn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    throw Error(std::string(op) + " on " + group.describe() + " could not start: " + error_text(e));
  }
}

thread_local bool out_of_band = false;

// Records the collective in the flight recorder and, under
// FSDP_DEBUG=detail, checks that every rank is issuing the same one.
int64_t record(const char* op, ProcessGroup& group, const at::Tensor& t) {
  if (out_of_band) return 0;  // unrecorded: Work::wait and complete() ignore seq 0
  const int64_t seq = FlightRecorder::instance().issue(op, group.name(), group.role(), group.rank(), group.size(), t.numel(),
                                                       static_cast<int64_t>(t.nbytes()),
                                                       c10::toString(t.scalar_type()));
  if (detail_checks_enabled()) check_same_collective_everywhere(seq);
  return seq;
}

// See [Note: many ranks on one GPU] in host_staging.cpp. The staged call
// issues the same collective on host copies; inside it nothing is staged
// again (host stand-ins would be, under ProcessGroup::stage_host_tensors).
thread_local bool issuing_staged = false;

bool staged_through_host(ProcessGroup& group, const at::Tensor& t) {
  return !issuing_staged && group.backend() == Backend::kGloo && (!t.is_cpu() || group.stage_host_tensors);
}

template <typename IssueFn>
Work issue_on_host(IssueFn&& fn) {
  issuing_staged = true;
  try {
    Work work = fn();
    issuing_staged = false;
    return work;
  } catch (...) {
    issuing_staged = false;
    throw;
  }
}

// The group's shared-memory transport when it can take this collective (see
// [Note: shared-memory collectives]); null: the backend's path.
SharedMemoryTransport* shared(ProcessGroup& group, const at::Tensor& a, const at::Tensor& b = {}) {
  const bool on_cpu = a.is_cpu() && (!b.defined() || b.is_cpu());
  return group.shared_memory && on_cpu ? group.shared_memory.get() : nullptr;
}

}  // namespace

Work::Work(std::string op, ProcessGroup* group, std::vector<c10::intrusive_ptr<c10d::Work>> pending,
           std::function<void()> finish, int64_t seq)
    : op_(std::move(op)),
      group_(group),
      pending_(std::move(pending)),
      finish_(std::move(finish)),
      seq_(seq),
      done_(false) {}

Work::Work(Work&& other) noexcept
    : op_(std::move(other.op_)),
      group_(other.group_),
      pending_(std::move(other.pending_)),
      finish_(std::move(other.finish_)),
      seq_(other.seq_),
      done_(other.done_) {
  other.pending_.clear();
  other.finish_ = nullptr;
  other.done_ = true;
}

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    if (!done_) {
      try {
        wait();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "fsdp: %s\n", e.what());
      }
    }
    op_ = std::move(other.op_);
    group_ = other.group_;
    pending_ = std::move(other.pending_);
    finish_ = std::move(other.finish_);
    seq_ = other.seq_;
    done_ = other.done_;
    other.pending_.clear();
    other.finish_ = nullptr;
    other.done_ = true;
  }
  return *this;
}

Work::~Work() {
  if (done_) return;
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp: %s (in a collective that was never waited for)\n", e.what());
  }
}

namespace {
// Adds the time of its scope to the flight recorder's blocked time.
struct WaitTimer {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~WaitTimer() {
    if (out_of_band) return;
    FlightRecorder::instance().add_blocked(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  }
};
}  // namespace

OutOfBandCollectives::OutOfBandCollectives() { out_of_band = true; }
OutOfBandCollectives::~OutOfBandCollectives() { out_of_band = false; }

Work Work::and_then(std::function<void()> more) && {
  if (done_) {
    more();
    return std::move(*this);
  }
  finish_ = [first = std::move(finish_), more = std::move(more)] {
    if (first) first();
    more();
  };
  return std::move(*this);
}

void Work::wait() {
  if (done_) return;
  done_ = true;  // one attempt: a failed collective leaves the group unusable
  WaitTimer timer;
  for (auto& w : pending_) {
    try {
      w->wait(group_->timeout());
    } catch (const std::exception& e) {
      const long secs = static_cast<long>(group_->timeout().count() / 1000);
      FlightRecorder::instance().report_failure(seq_);
      throw Error(op_ + " #" + std::to_string(seq_) + " on " + group_->describe() + " failed: " + error_text(e) +
                  " (a peer died, hung, or issued a different collective; timeout " + std::to_string(secs) +
                  " s, set by FSDP_TIMEOUT; peers: " + group_->describe_peers() + ")");
    }
  }
  FlightRecorder::instance().complete(seq_, true);
  pending_.clear();
  if (finish_) finish_();
  finish_ = nullptr;
}

int64_t padded_numel(int64_t numel, int world) { return shard_numel(numel, world) * world; }

int64_t shard_numel(int64_t numel, int world) { return (numel + world - 1) / world; }

Work all_gather_into_tensor(ProcessGroup& group, const at::Tensor& output, const at::Tensor& input) {
  constexpr const char* kOp = "all_gather_into_tensor";
  check_flat(output, kOp, "output");
  check_flat(input, kOp, "input");
  const int w = group.size();
  FSDP_CHECK(output.numel() == input.numel() * w && output.scalar_type() == input.scalar_type(), kOp,
             ": output must hold world size (", w, ") x input (", input.numel(), " ", input.scalar_type(),
             ") elements, got ", output.numel(), " ", output.scalar_type());
  if (staged_through_host(group, input)) {
    const at::Tensor host_out = stage_to_host(output, false);
    const at::Tensor host_in = stage_to_host(input, true);
    return issue_on_host([&] { return all_gather_into_tensor(group, host_out, host_in); })
        .and_then([output, host_out] { unstage_from_host(output, host_out); });
  }
  const int64_t seq = record(kOp, group, input);
  if (auto* shm = shared(group, input, output)) {
    return Work(kOp, &group, {shm->all_gather(output, input)}, nullptr, seq);
  }
  // See [Note: host tensors on NCCL].
  const at::Tensor comm_output = on_comm_device(group, output);
  std::function<void()> copy_back;
  if (!comm_output.is_same(output)) copy_back = [output, comm_output] { output.copy_(comm_output); };
  at::Tensor out_bytes = as_bytes(comm_output);
  at::Tensor in_bytes = as_bytes(on_comm_device(group, input));
  if (group.backend() == Backend::kNccl) {
    auto work = issue(kOp, group, [&] { return group.impl()._allgather_base(out_bytes, in_bytes); });
    return Work(kOp, &group, {work}, copy_back, seq);
  }
  if (group.native_all_gather) {
    try {
      auto work = group.impl()._allgather_base(out_bytes, in_bytes);
      return Work(kOp, &group, {work}, nullptr, seq);
    } catch (const std::exception&) {
      group.native_all_gather = false;  // this backend lacks it; use the list form from now on
    }
  }
  std::vector<at::Tensor> outs;
  const int64_t chunk = in_bytes.numel();
  for (int i = 0; i < w; ++i) outs.push_back(out_bytes.narrow(0, i * chunk, chunk));
  std::vector<std::vector<at::Tensor>> outputs{outs};
  std::vector<at::Tensor> inputs{in_bytes};
  auto work = issue(kOp, group, [&] { return group.impl().allgather(outputs, inputs); });
  return Work(kOp, &group, {work}, nullptr, seq);
}

Work reduce_scatter_tensor(ProcessGroup& group, const at::Tensor& output, const at::Tensor& input,
                           ReduceOp op) {
  constexpr const char* kOp = "reduce_scatter_tensor";
  check_flat(output, kOp, "output");
  check_flat(input, kOp, "input");
  const int w = group.size();
  const int64_t n = output.numel();
  FSDP_CHECK(input.numel() == n * w && output.scalar_type() == input.scalar_type(), kOp,
             ": input must hold world size (", w, ") x output (", n, " ", output.scalar_type(),
             ") elements, got ", input.numel(), " ", input.scalar_type());
  FSDP_CHECK(op != ReduceOp::kMax, kOp, ": supports sum and avg");
  FSDP_CHECK(at::isFloatingType(input.scalar_type()) || op == ReduceOp::kSum, kOp,
             ": averaging needs a floating-point tensor, got ", input.scalar_type());
  if (staged_through_host(group, input)) {
    const at::Tensor host_out = stage_to_host(output, false);
    const at::Tensor host_in = stage_to_host(input, true);
    return issue_on_host([&] { return reduce_scatter_tensor(group, host_out, host_in, op); })
        .and_then([output, host_out] { unstage_from_host(output, host_out); });
  }
  const bool divide = divide_after(op, group.backend());
  const int64_t seq = record(kOp, group, input);
  if (auto* shm = shared(group, input, output); shm && SharedMemoryTransport::reduces(input.scalar_type(), true)) {
    return Work(kOp, &group, {shm->reduce_scatter(output, input, op)}, nullptr, seq);
  }

  if (group.backend() == Backend::kNccl) {
    // See [Note: host tensors on NCCL].
    at::Tensor out = on_comm_device(group, output);
    at::Tensor in = on_comm_device(group, input);
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d_op(op, group.backend());
    auto work = issue(kOp, group, [&] { return group.impl()._reduce_scatter_base(out, in, opts); });
    std::function<void()> copy_back;
    if (!out.is_same(output)) copy_back = [output, out] { output.copy_(out); };
    return Work(kOp, &group, {work}, copy_back, seq);
  }
  if (group.native_reduce_scatter && !is_half(input)) {
    try {
      c10d::ReduceScatterOptions opts;
      opts.reduceOp = c10d_op(op, group.backend());
      at::Tensor out = output;
      at::Tensor in = input;
      auto work = group.impl()._reduce_scatter_base(out, in, opts);
      return Work(
          kOp, &group, {work},
          [output, divide, w] {
            if (divide) output.div_(w);
          },
          seq);
    } catch (const std::exception&) {
      group.native_reduce_scatter = false;
    }
  }
  // See [Note: reduce-scatter on Gloo].
  at::Tensor received = memory::empty_flat(input.numel(), input.options());
  auto counted = std::make_shared<memory::Reservation>(memory::BufferKind::kComm,
                                                       static_cast<int64_t>(received.nbytes()));
  at::Tensor recv_bytes = as_bytes(received);
  at::Tensor send_bytes = as_bytes(input);
  std::vector<int64_t> equal_splits;
  auto work = issue(kOp, group, [&] {
    return group.impl().alltoall_base(recv_bytes, send_bytes, equal_splits, equal_splits);
  });
  return Work(kOp, &group, {work}, [output, received, counted, divide, w, n] {
    at::Tensor chunks = received.view({w, n});
    if (is_half(chunks)) {
      at::Tensor sum = chunks.to(at::kFloat).sum(0);
      if (divide) sum.div_(w);
      output.copy_(sum.view(output.sizes()));
      return;
    }
    at::Tensor out = output.view({n});
    at::sum_out(out, chunks, at::IntArrayRef{0});  // straight into the output: no shard-sized temporary
    if (divide) out.div_(w);
  }, seq);
}

Work all_reduce(ProcessGroup& group, const at::Tensor& tensor, ReduceOp op) {
  constexpr const char* kOp = "all_reduce";
  check_flat(tensor, kOp, "tensor");
  FSDP_CHECK(at::isFloatingType(tensor.scalar_type()) || op != ReduceOp::kAvg, kOp,
             ": averaging needs a floating-point tensor, got ", tensor.scalar_type());
  if (staged_through_host(group, tensor)) {
    const at::Tensor host = stage_to_host(tensor, true);
    return issue_on_host([&] { return all_reduce(group, host, op); }).and_then([tensor, host] {
      unstage_from_host(tensor, host);
    });
  }
  const bool divide = divide_after(op, group.backend());
  const int64_t seq = record(kOp, group, tensor);
  if (auto* shm = shared(group, tensor); shm && SharedMemoryTransport::reduces(tensor.scalar_type(), false)) {
    return Work(kOp, &group, {shm->all_reduce(tensor, op)}, nullptr, seq);
  }
  const bool widen = is_half(tensor) && group.backend() == Backend::kGloo;
  // See [Note: host tensors on NCCL].
  at::Tensor buffer = widen ? tensor.to(at::kFloat) : on_comm_device(group, tensor);
  const bool copy_back = widen || !buffer.is_same(tensor);
  auto counted = std::make_shared<memory::Reservation>(memory::BufferKind::kComm,
                                                       widen ? static_cast<int64_t>(buffer.nbytes()) : 0);
  std::vector<at::Tensor> tensors{buffer};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d_op(op, group.backend());
  opts.timeout = group.timeout();
  auto work = issue(kOp, group, [&] { return group.impl().allreduce(tensors, opts); });
  const int w = group.size();
  return Work(kOp, &group, {work}, [tensor, buffer, counted, divide, w, copy_back] {
    if (divide) buffer.div_(w);
    if (copy_back) tensor.copy_(buffer);
  }, seq);
}

Work broadcast(ProcessGroup& group, const at::Tensor& tensor, int root) {
  constexpr const char* kOp = "broadcast";
  check_flat(tensor, kOp, "tensor");
  FSDP_CHECK(root >= 0 && root < group.size(), kOp, ": root ", root, " is not a rank of ", group.describe());
  if (staged_through_host(group, tensor)) {
    const at::Tensor host = stage_to_host(tensor, true);
    return issue_on_host([&] { return broadcast(group, host, root); }).and_then([tensor, host] {
      unstage_from_host(tensor, host);
    });
  }
  const int64_t seq = record(kOp, group, tensor);
  if (auto* shm = shared(group, tensor)) return Work(kOp, &group, {shm->broadcast(tensor, root)}, nullptr, seq);
  // See [Note: host tensors on NCCL].
  const at::Tensor buffer = on_comm_device(group, tensor);
  std::vector<at::Tensor> tensors{as_bytes(buffer)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = group.timeout();
  auto work = issue(kOp, group, [&] { return group.impl().broadcast(tensors, opts); });
  std::function<void()> copy_back;
  if (!buffer.is_same(tensor)) copy_back = [tensor, buffer] { tensor.copy_(buffer); };
  return Work(kOp, &group, {work}, copy_back, seq);
}

void barrier(ProcessGroup& group) {
  const int64_t seq = record("barrier", group, at::empty({0}));
  c10d::BarrierOptions opts;
  opts.timeout = group.timeout();
  auto work = group.shared_memory ? group.shared_memory->barrier()
                                  : issue("barrier", group, [&] { return group.impl().barrier(opts); });
  Work("barrier", &group, {work}, nullptr, seq).wait();
}

}  // namespace fsdp::dist
