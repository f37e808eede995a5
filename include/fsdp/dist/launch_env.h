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

}  // namespace fsdp::dist
