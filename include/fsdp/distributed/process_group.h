#pragma once
// Process groups: a set of ranks that run collectives together, on top of
// c10d (Gloo on CPU; NCCL when built against a CUDA LibTorch).

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include "fsdp/common/compat.h"
#include "fsdp/common/enum_spellings.h"
#include "fsdp/distributed/launch_env.h"

namespace c10d {
class Store;
}

namespace fsdp::dist {

enum class Backend { kGloo, kNccl };

const char* to_string(Backend backend);
// Throws fsdp::Error naming the accepted backends.
Backend parse_backend(const std::string& name);

// Where a rank computes. kAuto: a CUDA GPU when this build has CUDA and one
// is visible, else the CPU.
enum class DeviceChoice { kAuto, kCpu, kCuda };
// Throws fsdp::Error naming the accepted choices (auto, cpu, cuda).
DeviceChoice parse_device_choice(const std::string& name);

}  // namespace fsdp::dist

namespace fsdp {
template <>
struct EnumSpellings<dist::Backend> {
  static constexpr Spelling<dist::Backend> kTable[] = {{dist::Backend::kGloo, "gloo"}, {dist::Backend::kNccl, "nccl"}};
};
template <>
struct EnumSpellings<dist::DeviceChoice> {
  static constexpr Spelling<dist::DeviceChoice> kTable[] = {
      {dist::DeviceChoice::kAuto, "auto"}, {dist::DeviceChoice::kCpu, "cpu"}, {dist::DeviceChoice::kCuda, "cuda"}};
};
}  // namespace fsdp

namespace fsdp::dist {

class SharedMemoryTransport;

// The one device decision of a rank: the CPU, or CUDA device LOCAL_RANK
// (modulo the visible count). Throws when CUDA is asked for and this build
// has none or no device is visible.
c10::Device choose_device(DeviceChoice choice, const LaunchEnv& env);
// How many ranks of this host compute on `device` (choose_device's layout):
// 1 on the CPU and where each rank has a GPU of its own.
int ranks_sharing_device(const c10::Device& device, const LaunchEnv& env);
// The backend for a device when none is asked for: NCCL for a GPU of one
// rank's own, Gloo for the CPU and for ranks sharing a GPU (their
// collectives go through host memory). An explicit NCCL on a CPU device or
// a shared GPU is refused with the reason.
Backend backend_for(const c10::Device& device, std::optional<Backend> requested, int sharing = 1);

struct DistOptions {
  std::optional<Backend> backend;                // backend_for(device) when unset
  DeviceChoice device = DeviceChoice::kAuto;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // every collective and the rendezvous
  // Gloo groups whose members share a host move their collectives through
  // shared memory rather than Gloo's TCP (see src/distributed/shared_memory.cpp);
  // ranks sharing a GPU stage its tensors through host memory to get there.
  bool shared_memory = true;

  // FSDP_BACKEND, FSDP_DEVICE, FSDP_TIMEOUT (seconds) and FSDP_SHARED_MEMORY
  // (1 or 0) override the defaults.
  static DistOptions from_env(const EnvMap& env);
};

// A group of ranks. All members call its collectives in the same order;
// non-members never touch it.
class ProcessGroup {
 public:
  ProcessGroup(std::string name, Backend backend, std::vector<int> global_ranks, int rank,
               std::chrono::milliseconds timeout, c10::intrusive_ptr<compat::C10dBackend> impl);

  const std::string& name() const { return name_; }
  // The group's part in the job, the same on every rank: "mesh2x2/shard"
  // for each rank's own shard group 'mesh2x2/shard0', 'mesh2x2/shard1', ...
  // Desync checks compare roles, not names.
  const std::string& role() const { return role_.empty() ? name_ : role_; }
  void set_role(std::string role) { role_ = std::move(role); }
  Backend backend() const { return backend_; }
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(global_ranks_.size()); }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  compat::C10dBackend& impl() { return *impl_; }

  // "group 'shard' (rank 1 of 2)": how errors name a group.
  std::string describe() const;
  // "rank 0 at 10.0.0.1, rank 2 at 10.0.0.3": the other members, for errors.
  std::string describe_peers() const;

  // Each member's address (as it reaches MASTER_ADDR), in group rank order.
  std::vector<std::string> hosts;

  // Set where every member shares this host and the backend is Gloo: the
  // collectives of collectives.h go through it instead of impl(), device
  // tensors staged through pinned host memory.
  // [Note: many ranks on one GPU] in collectives.cpp.
  std::shared_ptr<SharedMemoryTransport> shared_memory;
  // "shared memory", or the backend's name.
  const char* transport() const;

  // Whether to try c10d's flat all-gather / reduce-scatter; cleared the first
  // time the backend refuses, after which the portable fallback runs.
  bool native_all_gather = true;
  bool native_reduce_scatter = true;

  // Tests: host tensors take the path of device tensors on a Gloo group
  // (staged through a host copy), so that a CPU build runs that path.
  bool stage_host_tensors = false;

 private:
  std::string name_;
  std::string role_;
  Backend backend_;
  std::vector<int> global_ranks_;
  int rank_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<compat::C10dBackend> impl_;
};

// The job as a whole: the launch environment, the rendezvous store and the
// group of all ranks.
class World {
 public:
  // Rendezvous at MASTER_ADDR:MASTER_PORT and connect all ranks. Throws
  // fsdp::Error with one clear line when the port is unusable or a peer does
  // not arrive within the timeout.
  static std::shared_ptr<World> init(const LaunchEnv& env, const DistOptions& options);

  const LaunchEnv& env() const { return env_; }
  const DistOptions& options() const { return options_; }
  // This rank's device, decided once at init: the model, its data, FSDP's
  // buffers and the backend all follow it.
  const c10::Device& device() const { return device_; }
  Backend backend() const { return backend_; }
  int rank() const { return env_.rank; }
  int size() const { return env_.world_size; }
  ProcessGroup& group() { return *group_; }

  // A group of `global_ranks` (sorted, distinct). Only members call this;
  // `name` must be unique in the job and the same on all members.
  // `role` is the same on every rank for groups that play the same part
  // (each rank's own shard group, say); empty: the name. `backend`: the
  // world's unless given (Gloo beside NCCL, for host tensors).
  std::shared_ptr<ProcessGroup> new_group(const std::string& name, std::vector<int> global_ranks,
                                          const std::string& role = "",
                                          std::optional<Backend> backend = std::nullopt);

 private:
  World(LaunchEnv env, DistOptions options, c10::Device device, Backend backend,
        c10::intrusive_ptr<c10d::Store> store);
  void learn_hosts();

  LaunchEnv env_;
  DistOptions options_;
  c10::Device device_;
  Backend backend_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::shared_ptr<ProcessGroup> group_;
  std::vector<std::string> hosts_;  // by global rank
  std::map<std::string, int> groups_named_;  // makes store prefixes unique per creation
};

}  // namespace fsdp::dist
