// Bad input and failing peers give one clear line and a non-zero exit,
// never a hang or a stack dump.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "../test_paths.h"
#include "fsdp/distributed/launch_env.h"
#include "run_command.h"

namespace fsdp::testing::dist_errors_test {
namespace {

const std::string kCli = kCliProgram;
const std::string kWorker = kFaultWorker;

void expect_clean_failure(const CommandResult& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, needle)) << "expected '" << needle << "' in\n" << r.output;
  EXPECT_FALSE(contains(r.output, "frame #")) << "stack dump in\n" << r.output;
  EXPECT_FALSE(contains(r.output, "terminate called")) << r.output;
}

std::string single_rank(const std::string& extra_env) {
  return "env RANK=0 WORLD_SIZE=1 MASTER_PORT=" + std::to_string(dist::find_free_port()) + " " + extra_env + " ";
}

TEST(DistErrors, UnknownBackend) {
  const auto r = run_command(single_rank("") + kCli + " smoke --backend mpi");
  expect_clean_failure(r, "unknown backend 'mpi': expected 'gloo' or 'nccl'");
}

TEST(DistErrors, NcclWithoutCudaBuild) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA build has NCCL";
  const auto r = run_command(single_rank("FSDP_BACKEND=nccl") + kCli + " smoke");
  expect_clean_failure(r, "error: backend 'nccl' is not in this build (built against a CPU LibTorch): use 'gloo'");
}

TEST(DistErrors, UnknownDevice) {
  const auto r = run_command(single_rank("") + kCli + " smoke --device tpu");
  expect_clean_failure(r, "unknown device 'tpu': expected 'auto', 'cpu' or 'cuda'");
}

// Asking for the GPU where there is none fails before anything connects,
// saying why; the CUDA tests (tests/cuda/) cover the machine that has one.
TEST(DistErrors, CudaDeviceWithoutAGpuIsRefusedWithTheReason) {
#ifdef FSDP_WITH_CUDA
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible: tests/cuda/ runs the GPU path";
  const std::string reason = "device 'cuda': no CUDA device is visible";
#else
  const std::string reason = "device 'cuda': this build has no CUDA (built against a CPU LibTorch)";
#endif
  expect_clean_failure(run_command(single_rank("") + kCli + " smoke --device cuda"), reason);
  expect_clean_failure(run_command(single_rank("FSDP_DEVICE=cuda") + kCli + " smoke"), reason);
}

TEST(DistErrors, NcclOnTheCpuIsRefused) {
#ifndef FSDP_WITH_CUDA
  GTEST_SKIP() << "a CPU build has no NCCL to refuse (NcclWithoutCudaBuild covers it)";
#else
  const auto r = run_command(single_rank("") + kCli + " smoke --device cpu --backend nccl");
  expect_clean_failure(r, "backend 'nccl' needs a CUDA device, and this rank computes on the CPU");
#endif
}

TEST(DistErrors, RankNotBelowWorldSize) {
  const auto r = run_command("env RANK=2 WORLD_SIZE=2 " + kCli + " smoke");
  expect_clean_failure(r, "RANK=2 is not below WORLD_SIZE=2");
}

// A socket listening on a free port of `address` that never accepts (the
// kernel still completes connections, into its backlog); closed with it.
struct Listener {
  explicit Listener(uint32_t address) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(address);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd, 16), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  ~Listener() { ::close(fd); }
  int fd = -1, port = 0;
};

TEST(DistErrors, PortInUse) {
  // Hold a listening socket on a port, then ask rank 0 to serve on it.
  const Listener held(INADDR_ANY);
  const auto r = run_command("env RANK=0 WORLD_SIZE=1 FSDP_TIMEOUT=5 MASTER_PORT=" + std::to_string(held.port) + " " +
                             kCli + " smoke");
  expect_clean_failure(r, "already in use");
}

TEST(DistErrors, PeerNeverArrives) {
  const auto r = run_command(single_rank("WORLD_SIZE=2 FSDP_TIMEOUT=2") + kCli + " smoke");
  expect_clean_failure(r, "timed out");
  EXPECT_LT(r.seconds, 30);
}

// A node not started yet: rank 0 says every 10 s who has arrived and who
// is awaited, and the timeout names the missing ranks.
TEST(DistErrors, RankZeroSaysWhoItWaitsFor) {
  const std::string env = "env WORLD_SIZE=3 FSDP_TIMEOUT=12 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                          std::to_string(dist::find_free_port()) + " ";
  BackgroundCommand rank2(env + "RANK=2 " + kCli + " smoke", "/tmp/fsdp-rank2-" + std::to_string(::getpid()) + ".log");
  const auto r = run_command(env + "RANK=0 " + kCli + " smoke");
  expect_clean_failure(r, "ranks arrived (missing: ranks 1)");
  EXPECT_TRUE(contains(r.output, "2 of 3 ranks arrived after 1")) << r.output;
  EXPECT_TRUE(contains(r.output, " s; waiting for ranks 1 (up to 12 s)")) << r.output;
}

TEST(DistErrors, RankZeroNeverArrives) {
  const auto r = run_command("env RANK=1 WORLD_SIZE=2 FSDP_TIMEOUT=2 MASTER_PORT=" +
                             std::to_string(dist::find_free_port()) + " " + kCli + " smoke");
  expect_clean_failure(r, "could not reach rank 0");
  EXPECT_LT(r.seconds, 30);
}

// [Note: a rendezvous that never answers]: a port whose listener completes
// connections (the kernel does, from the backlog) but never answers.
TEST(DistErrors, APortThatAcceptsButNeverAnswersTimesOut) {
  const Listener silent(INADDR_LOOPBACK);
  const auto r = run_command("env RANK=1 WORLD_SIZE=2 FSDP_TIMEOUT=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                             std::to_string(silent.port) + " " + kCli + " smoke");
  expect_clean_failure(r, "rendezvous: rank 1 connected to 127.0.0.1:" + std::to_string(silent.port) +
                              " but got no answer within 3 s");
  EXPECT_LT(r.seconds, 30);
}

TEST(DistErrors, HungPeerTimesOutNamingTheCollective) {
  const auto r = run_command("env FSDP_TIMEOUT=3 " + kCli + " launch -n 2 -- " + kWorker + " hang");
  expect_clean_failure(r, "all_reduce #1 on group 'world'");
  EXPECT_LT(r.seconds, 40);
}

TEST(DistErrors, DeadPeerFailsTheCollective) {
  const auto r = run_command("env FSDP_TIMEOUT=20 " + kCli + " launch -n 2 -- " + kWorker + " die");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "rank 1")) << r.output;
  EXPECT_LT(r.seconds, 30);
}

// Without a launcher to stop the others (mpirun, Slurm, hand-started
// ranks), the survivor itself fails the collective at once, naming the
// rank that went away, over shared memory and over Gloo's TCP alike.
TEST(DistErrors, SurvivorNamesTheDeadPeerOnEitherTransport) {
  for (const char* shared : {"1", "0"}) {
    const std::string env = std::string("env FSDP_TIMEOUT=60 FSDP_SHARED_MEMORY=") + shared +
                            " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                            std::to_string(dist::find_free_port());
    const auto r = run_command("(" + env + " RANK=1 " + kWorker + " die &); " + env + " RANK=0 " + kWorker + " die");
    expect_clean_failure(r, "all_reduce #1 on group 'world'");
    if (std::string(shared) == "1") {
      EXPECT_TRUE(contains(r.output, "the group's rank 1 exited")) << r.output;
    }
    EXPECT_LT(r.seconds, 20) << "FSDP_SHARED_MEMORY=" << shared;
  }
}

// Ranks that disagree on FSDP_SHARED_MEMORY agree on Gloo, at once.
TEST(DistErrors, RanksThatDisagreeOnSharedMemoryAllKeepGloo) {
  const std::string env = "env FSDP_TIMEOUT=60 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                          std::to_string(dist::find_free_port());
  // Grouped, so that the rank's stderr is captured, not only the last command's.
  const auto r = run_command("((" + env + " RANK=1 FSDP_SHARED_MEMORY=0 " + kWorker + " ok &); " + env +
                             " RANK=0 FSDP_SHARED_MEMORY=1 " + kWorker + " ok)");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "shared memory is unavailable: rank 1: this rank does not take shared memory"))
      << r.output;
  EXPECT_LT(r.seconds, 20);
}

TEST(DistErrors, BadSharedMemorySetting) {
  const auto r = run_command(single_rank("FSDP_SHARED_MEMORY=yes") + kCli + " smoke");
  expect_clean_failure(r, "FSDP_SHARED_MEMORY='yes': expected 1");
}

TEST(DistErrors, BadTimeout) {
  const auto r = run_command(single_rank("FSDP_TIMEOUT=soon") + kCli + " smoke");
  expect_clean_failure(r, "FSDP_TIMEOUT='soon'");
}

}  // namespace
}  // namespace fsdp::testing::dist_errors_test
