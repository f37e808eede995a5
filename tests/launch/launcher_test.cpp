// `fsdp launch` run as a user runs it: environment, output, failure
// propagation and signal forwarding.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "../cli/run_command.h"
#include "../test_paths.h"
#include "fsdp/launch/launcher.h"

namespace fsdp::testing::launcher_test {
namespace {

const std::string kCli = kCliProgram;

std::string launch(const std::string& args) { return kCli + " launch " + args; }

TEST(Launcher, SetsTheRendezvousEnvironmentPerRank) {
  const auto r = run_command(launch(
      "-n 3 --master-port 29777 --threads-per-rank 2 -- sh -c "
      "'echo env $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $OMP_NUM_THREADS'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string line = "[rank " + std::to_string(rank) + "] env " + std::to_string(rank) + " " +
                             std::to_string(rank) + " 3 3 127.0.0.1 29777 2";
    EXPECT_TRUE(contains(r.output, line)) << "missing '" << line << "' in\n" << r.output;
  }
}

TEST(Launcher, PicksAFreePortAndDividesCores) {
  const auto r = run_command("env -u OMP_NUM_THREADS " + launch("-n 2 -- sh -c 'echo port=$MASTER_PORT threads=$OMP_NUM_THREADS'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "port=29500")) << r.output;
  const int expected_threads = std::max(1, launch::available_cores() / 2);
  EXPECT_TRUE(contains(r.output, "threads=" + std::to_string(expected_threads))) << r.output;
}

TEST(Launcher, PlacesForEachRankAreItsOwnSliceOfTheAllowedCpus) {
  const std::vector<int> cpus{0, 1, 2, 3, 6, 7, 8, 9};
  EXPECT_EQ(launch::omp_places_for(cpus, 0, 4, 2), "{0},{1}");
  EXPECT_EQ(launch::omp_places_for(cpus, 2, 4, 2), "{6},{7}");
  EXPECT_EQ(launch::omp_places_for(cpus, 1, 2, 4), "{6},{7},{8},{9}");
  EXPECT_EQ(launch::omp_places_for(cpus, 0, 3, 3), "") << "9 threads on 8 CPUs: not pinned";
}

TEST(Launcher, PinsEachRanksThreadsUnlessTheUserPlacedThem) {
  const std::string show = " -- sh -c 'echo places=$OMP_PLACES bind=$OMP_PROC_BIND'";
  const auto cpus = launch::allowed_cpus();
  const std::string clean = "env -u OMP_NUM_THREADS -u OMP_PLACES -u OMP_PROC_BIND ";
  // One rank per pair of CPUs: each has two (or three) threads of its own, pinned.
  const int ranks = std::max(1, static_cast<int>(cpus.size()) / 2);
  const auto r = run_command(clean + launch("-n " + std::to_string(ranks) + show));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  if (cpus.size() >= 2) {
    for (int rank = 0; rank < ranks; ++rank) {
      const std::string line = "[rank " + std::to_string(rank) + "] places=" +
                               launch::omp_places_for(cpus, rank, ranks, static_cast<int>(cpus.size()) / ranks) +
                               " bind=close";
      EXPECT_TRUE(contains(r.output, line)) << "missing '" << line << "' in\n" << r.output;
    }
  }
  // One thread per rank: left unbound, so Gloo's threads may use other cores.
  const auto single = run_command(clean + launch("-n " + std::to_string(cpus.size()) + show));
  EXPECT_TRUE(contains(single.output, "places= bind=\n")) << single.output;
  const auto user = run_command("env -u OMP_NUM_THREADS -u OMP_PLACES OMP_PROC_BIND=spread " + launch("-n 1" + show));
  EXPECT_TRUE(contains(user.output, "places= bind=spread")) << user.output;
  const auto off = run_command(clean + "FSDP_PIN_THREADS=0 " + launch("-n 1" + show));
  EXPECT_TRUE(contains(off.output, "places= bind=\n")) << off.output;
}

TEST(Launcher, PrefixesEveryLineIncludingStderrAndUnterminatedOutput) {
  const auto r = run_command(launch("-n 2 -- sh -c 'echo one; echo two >&2; printf three'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* word : {"one", "two", "three"}) {
    EXPECT_TRUE(contains(r.output, std::string("[rank 1] ") + word)) << r.output;
  }
}

TEST(Launcher, OneFailingRankStopsTheOthers) {
  const std::string dir = make_temp_dir();
  // Ranks 0 and 2 record their pids and sleep; rank 1 fails after they started.
  const auto r = run_command(launch("-n 3 -- sh -c 'if [ $RANK = 1 ]; then sleep 1; exit 3; fi; echo $$ > " + dir +
                                    "/pid$RANK; exec sleep 60'"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.seconds, 10.0) << "the launcher must not wait for the sleeping ranks";
  EXPECT_TRUE(contains(r.output, "rank 1")) << r.output;
  EXPECT_TRUE(contains(r.output, "exited with code 3")) << r.output;
  for (int rank : {0, 2}) {
    std::ifstream in(dir + "/pid" + std::to_string(rank));
    pid_t pid = 0;
    ASSERT_TRUE(in >> pid) << "rank " << rank << " never started";
    EXPECT_EQ(::kill(pid, 0), -1) << "rank " << rank << " (pid " << pid << ") is still running";
  }
}

TEST(Launcher, ReportsARankKilledBySignal) {
  const auto r = run_command(launch("-n 2 -- sh -c 'if [ $RANK = 0 ]; then kill -9 $$; fi; exec sleep 60'"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(contains(r.output, "rank 0")) << r.output;
  EXPECT_TRUE(contains(r.output, "killed by SIGKILL")) << r.output;
}

// Starts `fsdp launch -n 2 -- sh -c SCRIPT`, waits until both ranks have
// touched DIR/up<RANK>, sends SIGTERM to the launcher only, and returns its
// exit code.
int sigterm_launcher(const std::string& dir, const std::string& script) {
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::execl(kCli.c_str(), kCli.c_str(), "launch", "-n", "2", "--", "sh", "-c", script.c_str(), nullptr);
    ::_exit(127);
  }
  for (int i = 0; i < 100; ++i) {
    if (std::ifstream(dir + "/up0") && std::ifstream(dir + "/up1")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(Launcher, ForwardsSigtermAndExitsWith143AsTorchrunWhenEveryRankStopsCleanly) {
  // Each rank notes that it received SIGTERM, then exits 143, as `fsdp
  // train` does after saving (or 0, as another program may): clean either
  // way, and the launcher exits 128 + SIGTERM, so `&& next-step` stops.
  for (const char* rank_exit : {"143", "0"}) {
    const std::string dir = make_temp_dir();
    const std::string script = "trap 'echo term > " + dir + "/got$RANK; exit " + rank_exit + "' TERM; touch " + dir +
                               "/up$RANK; while true; do sleep 0.1; done";
    EXPECT_EQ(sigterm_launcher(dir, script), 128 + SIGTERM) << "ranks exiting " << rank_exit;
    EXPECT_TRUE(std::ifstream(dir + "/got0").good()) << "rank 0 did not get SIGTERM";
    EXPECT_TRUE(std::ifstream(dir + "/got1").good()) << "rank 1 did not get SIGTERM";
  }
}

TEST(Launcher, ForwardsSigtermToRanksThatThenExitZero) {
  const std::string dir = make_temp_dir();
  const std::string script =
      "trap 'echo term > " + dir + "/got$RANK; exit 0' TERM; touch " + dir + "/up$RANK; while true; do sleep 0.1; done";
  EXPECT_EQ(sigterm_launcher(dir, script), 128 + SIGTERM);
  EXPECT_TRUE(std::ifstream(dir + "/got0").good()) << "rank 0 did not get SIGTERM";
  EXPECT_TRUE(std::ifstream(dir + "/got1").good()) << "rank 1 did not get SIGTERM";
}

TEST(Launcher, ForwardsSigtermAndExitsNonZeroWhenARankDoesNotStopCleanly) {
  const std::string dir = make_temp_dir();
  // Rank 1 fails while stopping (exit 3); rank 0 stops cleanly.
  const std::string script = "trap 'echo term > " + dir + "/got$RANK; [ $RANK = 1 ] && exit 3; exit 0' TERM; touch " +
                             dir + "/up$RANK; while true; do sleep 0.1; done";
  EXPECT_EQ(sigterm_launcher(dir, script), 128 + SIGTERM);
  EXPECT_TRUE(std::ifstream(dir + "/got0").good()) << "rank 0 did not get SIGTERM";
  EXPECT_TRUE(std::ifstream(dir + "/got1").good()) << "rank 1 did not get SIGTERM";
}

TEST(Launcher, UnknownProgramIsReported) {
  const auto r = run_command(launch("-n 2 -- /nonexistent/program"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "cannot run '/nonexistent/program'")) << r.output;
}

TEST(Launcher, BadOptionsAreRejectedBeforeStarting) {
  auto r = run_command(launch("-n 0 -- true"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "expected at least 1 rank")) << r.output;
  r = run_command(launch("-n 1 --nnodes 2 --node-rank 2 -- true"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--node-rank 2 is not below --nnodes 2")) << r.output;
}

TEST(Launcher, MultiNodeRankOffsets) {
  const auto r = run_command(launch("-n 2 --nnodes 3 --node-rank 1 --master-port 29778 -- sh -c 'echo r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 2] r=2 w=6 l=0")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 3] r=3 w=6 l=1")) << r.output;
}

}  // namespace
}  // namespace fsdp::testing::launcher_test
