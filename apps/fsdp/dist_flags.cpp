#include "dist_flags.h"

#include "fsdp/common/error.h"
#include "fsdp/common/runtime.h"

namespace fsdp::cli {

void DistFlags::add_to(CLI::App& command) {
  command.add_option("--device", device,
                     "auto, cpu or cuda (CUDA builds; GPU LOCAL_RANK); default: auto, a GPU if one is visible");
  command.add_option("--backend", backend, "gloo (CPU) or nccl (CUDA builds); default: nccl on a GPU of the rank's own, gloo on the CPU and where ranks share a GPU");
  command.add_option("--timeout", timeout_s,
                     "seconds a collective or the rendezvous may take before failing (default 300, or FSDP_TIMEOUT)");
}

std::shared_ptr<dist::World> DistFlags::init_world() const {
  const EnvMap env = current_env();
  const dist::LaunchEnv launch = dist::parse_launch_env(env);
  dist::DistOptions options = dist::DistOptions::from_env(env);
  if (!device.empty()) options.device = dist::parse_device_choice(device);
  if (!backend.empty()) options.backend = dist::parse_backend(backend);
  if (timeout_s != 0) {
    FSDP_CHECK(timeout_s > 0, "--timeout ", timeout_s, ": expected a positive number of seconds");
    options.timeout = std::chrono::milliseconds(static_cast<long>(timeout_s * 1000));
  }
  init_runtime();
  return dist::World::init(launch, options);
}

}  // namespace fsdp::cli
