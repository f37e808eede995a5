#pragma once
// `fsdp launch`: runs a command once per rank on this machine, like
// `torchrun --standalone --no-python`. Light header: no LibTorch.

#include <string>
#include <vector>

namespace fsdp::launch {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;             // 0: a free port (single node only)
  int threads_per_rank = 0;        // 0: this machine's cores / nproc_per_node, at least 1
  // SIGTERM, then SIGKILL after this long: enough for `fsdp train` to finish
  // its step and save a checkpoint.
  double stop_grace_s = 30.0;
  bool prefix_output = true;       // "[rank N] " before every line
  std::vector<std::string> command;
};

// Throws fsdp::Error for inconsistent options (before starting anything).
void validate(const LaunchOptions& options);

// Starts the ranks and supervises them. Returns 0 when every rank exits 0;
// otherwise stops the survivors and returns non-zero after printing which rank
// failed and how. SIGINT/SIGTERM received by the launcher are forwarded.
int run(const LaunchOptions& options);

// A TCP port that was free a moment ago (bound to port 0, then released).
int find_free_port();

// Cores this process may run on (sched_getaffinity), at least 1.
int available_cores();
// Their CPU numbers, in order.
std::vector<int> allowed_cpus();

// OpenMP places for one rank of `ranks` on this node, `threads` each: its own
// slice of `cpus` ("{4},{5}" for rank 2 of 4 with 2 threads on 8 CPUs), or
// empty when the ranks' threads do not fit on distinct CPUs.
std::string omp_places_for(const std::vector<int>& cpus, int local_rank, int ranks, int threads);

}  // namespace fsdp::launch
