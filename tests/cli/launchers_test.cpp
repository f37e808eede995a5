// The programs start under other launchers: two ranks started by hand with
// exactly the variables torchrun, Slurm's srun or Open MPI's mpirun set,
// rendezvous and pass `fsdp smoke`.

#include <gtest/gtest.h>

#include "../test_paths.h"
#include "fsdp/distributed/launch_env.h"
#include "run_command.h"

namespace fsdp::testing::launchers_test {
namespace {

const std::string kCli = kCliProgram;

// Starts rank 0 and rank 1 with their environments; both must succeed.
CommandResult run_two_ranks(const std::string& env0, const std::string& env1) {
  const std::string smoke = kCli + " smoke --mib 1 --timeout 30";
  return run_command("sh -c 'env " + env0 + " OMP_NUM_THREADS=1 " + smoke + " & p=$!; env " + env1 +
                     " OMP_NUM_THREADS=1 " + smoke + "; b=$?; wait $p; a=$?; exit $((a | b))'");
}

std::string port() { return std::to_string(dist::find_free_port()); }

TEST(Launchers, TorchrunVariables) {
  const std::string common = "WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 ROLE_RANK=0 ROLE_NAME=default "
                             "TORCHELASTIC_RESTART_COUNT=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port();
  const auto r = run_two_ranks(common + " RANK=0 LOCAL_RANK=0", common + " RANK=1 LOCAL_RANK=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "launcher: torchrun")) << r.output;
  EXPECT_TRUE(contains(r.output, "smoke: OK")) << r.output;
}

TEST(Launchers, SlurmVariables) {
  const std::string common = "SLURM_NTASKS=2 SLURM_NNODES=1 SLURM_TASKS_PER_NODE=2 SLURM_JOB_ID=1 MASTER_PORT=" + port();
  const auto r = run_two_ranks(common + " SLURM_PROCID=0 SLURM_LOCALID=0", common + " SLURM_PROCID=1 SLURM_LOCALID=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "launcher: Slurm")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1 of 2 (local 1 of 2)")) << r.output;
  EXPECT_TRUE(contains(r.output, "smoke: OK")) << r.output;
}

TEST(Launchers, OpenMpiVariables) {
  const std::string common = "OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_SIZE=2 MASTER_ADDR=localhost MASTER_PORT=" + port();
  const auto r = run_two_ranks(common + " OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_LOCAL_RANK=0",
                               common + " OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_LOCAL_RANK=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "launcher: Open MPI")) << r.output;
  EXPECT_TRUE(contains(r.output, "smoke: OK")) << r.output;
}

}  // namespace
}  // namespace fsdp::testing::launchers_test

namespace fsdp::testing::launchers_test {
namespace {

TEST(Launchers, LoneProcessesDoNotCollideOnAPort) {
  // Without a launcher and without MASTER_PORT, each process serves its own
  // rendezvous on a free port, so two can run side by side.
  const std::string smoke = "env -u RANK -u WORLD_SIZE -u MASTER_PORT " + kCli + " smoke --mib 1";
  const auto r = run_command("sh -c '" + smoke + " & p=$!; " + smoke + "; b=$?; wait $p; a=$?; exit $((a | b))'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "launcher: single-process")) << r.output;
}

}  // namespace
}  // namespace fsdp::testing::launchers_test
