#include "fsdp/distributed/launch_env.h"

#include <gtest/gtest.h>

#include "fsdp/common/error.h"

namespace fsdp::dist {
namespace {

// Expects parse_launch_env to throw an fsdp::Error whose message contains `needle`.
void expect_error(const EnvMap& env, const std::string& needle) {
  try {
    parse_launch_env(env);
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LaunchEnv, NoLauncherIsOneProcess) {
  const LaunchEnv env = parse_launch_env({});
  EXPECT_EQ(env.launcher, Launcher::kNone);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 0) << "a lone process serves its rendezvous on any free port";
}

TEST(LaunchEnv, LauncherDefaultPortIsTorchruns) {
  EXPECT_EQ(parse_launch_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).master_port, 29500);
}

TEST(LaunchEnv, Torchrun) {
  const LaunchEnv env = parse_launch_env({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                          {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "node0"},
                                          {"MASTER_PORT", "1234"}});
  EXPECT_EQ(env.launcher, Launcher::kTorchrun);
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.master_port, 1234);
  EXPECT_TRUE(env.multi_node());
}

TEST(LaunchEnv, OpenMpi) {
  const LaunchEnv env = parse_launch_env({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}});
  EXPECT_EQ(env.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
}

TEST(LaunchEnv, SlurmWithCompressedTasksPerNode) {
  const LaunchEnv env = parse_launch_env({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"},
                                          {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"MASTER_ADDR", "n1"},
                                          {"MASTER_PORT", "29600"}});
  EXPECT_EQ(env.launcher, Launcher::kSlurm);
  EXPECT_EQ(env.rank, 6);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_port, 29600);
}

TEST(LaunchEnv, SlurmSingleNodeNeedsNoMasterAddr) {
  const LaunchEnv env = parse_launch_env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"},
                                          {"SLURM_NTASKS_PER_NODE", "2"}});
  EXPECT_FALSE(env.multi_node());
  EXPECT_EQ(env.master_addr, "127.0.0.1");
}

TEST(LaunchEnv, TorchrunVariablesWinOverSlurm) {
  // torchrun started inside a Slurm allocation: its variables describe this process.
  const LaunchEnv env = parse_launch_env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"},
                                          {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(env.launcher, Launcher::kTorchrun);
  EXPECT_EQ(env.rank, 1);
}

TEST(LaunchEnv, RankNotBelowWorldSize) { expect_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK=2 is not below WORLD_SIZE=2"); }

TEST(LaunchEnv, MissingWorldSize) { expect_error({{"RANK", "0"}}, "WORLD_SIZE is not"); }

TEST(LaunchEnv, MissingRank) { expect_error({{"WORLD_SIZE", "2"}}, "RANK is not"); }

TEST(LaunchEnv, MalformedNumber) { expect_error({{"RANK", "one"}, {"WORLD_SIZE", "2"}}, "RANK is 'one'"); }

TEST(LaunchEnv, NegativeNumber) { expect_error({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, "non-negative integer"); }

TEST(LaunchEnv, ZeroWorldSize) { expect_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "at least 1"); }

TEST(LaunchEnv, PortOutOfRange) {
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT=70000");
}

TEST(LaunchEnv, MultiNodeWithoutMasterAddr) {
  expect_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
               "MASTER_ADDR is not set");
}

TEST(LaunchEnv, LocalRankBeyondNode) {
  expect_error({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"},
                {"MASTER_ADDR", "a"}},
               "LOCAL_RANK=2");
}

}  // namespace
}  // namespace fsdp::dist
