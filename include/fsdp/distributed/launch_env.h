#pragma once
// Who am I in the job? Read from whichever launcher started this process:
// `fsdp launch` or torchrun (RANK, WORLD_SIZE, ...), Open MPI's mpirun
// (OMPI_COMM_WORLD_*), or Slurm's srun (SLURM_PROCID, SLURM_NTASKS, ...).
// Light header: no LibTorch.

#include <string>

#include "fsdp/common/env.h"

namespace fsdp::dist {

enum class Launcher { kNone, kTorchrun, kOpenMpi, kSlurm };

const char* to_string(Launcher launcher);

struct LaunchEnv {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  // torchrun's default, 29500, under a launcher; 0 for a lone process
  // without MASTER_PORT, which then serves the rendezvous on any free port.
  int master_port = 29500;

  bool multi_node() const { return local_world_size < world_size; }
};

// Precedence when several launchers' variables are present (torchrun inside
// a Slurm allocation, say): RANK/WORLD_SIZE, then OMPI_COMM_WORLD_*, then SLURM_*.
// Throws fsdp::Error naming the variable for missing, malformed or
// inconsistent values (RANK >= WORLD_SIZE, a multi-node job without MASTER_ADDR).
LaunchEnv parse_launch_env(const EnvMap& env);

// What `fsdp launch` tells its ranks beyond torchrun's variables (see
// [Note: restarts] in src/launch/launcher.cpp): which attempt this is (0,
// 1, ... under --max-restarts), and, as "1", that the launcher serves the
// job's store on MASTER_PORT, so rank 0 joins it instead of serving one.
inline constexpr const char* kRestartAttemptVar = "FSDP_RESTART_ATTEMPT";
inline constexpr const char* kAgentStoreVar = "FSDP_AGENT_STORE";

// A TCP port that was free a moment ago, below the kernel's ephemeral range:
// the rendezvous port `fsdp launch` hands its ranks, or a lone process
// serves itself.
int find_free_port();

}  // namespace fsdp::dist
