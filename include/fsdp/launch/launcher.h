#pragma once
// `fsdp launch`: runs a command once per rank on this machine, like
// `torchrun --standalone --no-python`. Light header: no LibTorch.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::launch {

// A key-value store every node's launcher reaches, served by node 0's
// launcher on --master-port: how the launchers agree to restart together,
// and the store the ranks rendezvous in (see [Note: restarts]).
class JobStore {
 public:
  virtual ~JobStore() = default;
  // Adds `delta` to the counter `key` (0 to read it) and returns its value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::optional<std::string> get_if_set(const std::string& key) = 0;
};

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
  // Restarts of the whole group after a rank fails (torchrun's
  // --max-restarts); the ranks are expected to resume from their checkpoints.
  int max_restarts = 0;
  std::vector<std::string> command;
  // Connects to (node 0: serves) the job's store at master_addr:port. Needed
  // for max_restarts > 0; `fsdp launch` passes LibTorch's TCPStore.
  std::function<std::unique_ptr<JobStore>(const std::string& addr, int port, bool serve, int nodes)> open_job_store;
};

// Throws fsdp::Error for inconsistent options (before starting anything).
void validate(const LaunchOptions& options);

// Starts the ranks and supervises them. Returns 0 when every rank exits 0;
// otherwise stops the survivors and returns non-zero after printing which rank
// failed and how. SIGINT/SIGTERM received by the launcher are forwarded; then
// it returns 0 when every rank still exits 0 (`fsdp train` saves and stops
// cleanly), else 128 + the signal.
int run(const LaunchOptions& options);

// Cores this process may run on (sched_getaffinity), at least 1.
int available_cores();
// Their CPU numbers, in order.
std::vector<int> allowed_cpus();

// OpenMP places for one rank of `ranks` on this node, `threads` each: its own
// slice of `cpus` ("{4},{5}" for rank 2 of 4 with 2 threads on 8 CPUs), or
// empty when the ranks' threads do not fit on distinct CPUs.
std::string omp_places_for(const std::vector<int>& cpus, int local_rank, int ranks, int threads);

}  // namespace fsdp::launch
