// The job survives and explains failures, each injected on purpose: ranks
// killed at random moments (one inside a save) and restarted by the
// launcher; ranks that issue different collectives; a rank that hangs; a
// rank killed inside a collective. And a stop on request (SIGINT) is no failure.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../test_paths.h"
#include "fsdp/distributed/flight_recorder.h"
#include "fsdp/distributed/launch_env.h"
#include "fsdp/io/safetensors.h"
#include "run_command.h"
#include "train_support.h"

namespace fsdp::testing::reliability_test {
namespace {

namespace fs = std::filesystem;
const std::string kCli = kCliProgram;
const std::string kWorker = kFaultWorker;

// How many times `needle` occurs in `text`.
int occurrences(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}


// Saves written before the step goes on, or in the background
// (--async-save): a kill lands inside one either way, and the straight run
// saves the same way.
class Restarts : public ::testing::TestWithParam<bool> {};
TEST_P(Restarts, RanksKilledAtRandomMomentsRestartAndEndWithTheUninterruptedWeights) {
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  const std::string train = kCli + " train --model gpt2-tiny --seq-len 16 --batch-size 2 --lr 1e-3 --log-every 50 "
                                   "--steps 400 --save-every 20 --data " + corpus +
                            (GetParam() ? " --async-save" : "");
  const auto straight = run_command(kCli + " launch -n 2 -- " + train + " --out-dir " + dir + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;

  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("random seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  // Kill 1: rank 0 dies inside its k-th save (after its shard and the
  // metadata are written, before `latest` moves). Kills 2 and 3: a random
  // rank, a random 0-100 ms after the restarted attempt's 1st to 3rd save
  // (seen within 20 ms).
  // Counting saves rather than waiting a random time keeps every kill inside
  // the attempt on any machine: the last one lands by about step 180 of 400,
  // where a timed kill could come after a fast attempt had finished.
  const int save_to_die_in = std::uniform_int_distribution<int>(1, 3)(rng);
  BackgroundCommand job("env FSDP_FAULT_POINT=checkpoint.before_publish@" + std::to_string(save_to_die_in) +
                            " FSDP_TIMEOUT=20 " + kCli + " launch -n 2 --max-restarts 3 --stop-grace 5 -- " + train +
                            " --out-dir " + dir + "/restarted",
                        dir + "/restarted.log");
  // The first attempt's ranks: they die by the injected fault.
  std::vector<int> old_ranks = job.wait_for_new_children({}, std::chrono::seconds(60));
  for (int kill = 0; kill < 2; ++kill) {
    const auto ranks = job.wait_for_new_children(old_ranks, std::chrono::seconds(60));
    ASSERT_EQ(ranks.size(), 2u) << job.output();
    const int saves_before = occurrences(job.output(), "] saved ");
    const int saves = std::uniform_int_distribution<int>(1, 3)(rng);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (occurrences(job.output(), "] saved ") < saves_before + saves) {
      ASSERT_FALSE(job.exited()) << "the job ended before save " << saves << " of attempt " << kill + 2 << ":\n"
                                 << job.output();
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no save " << saves << " in attempt " << kill + 2
                                                            << ":\n" << job.output();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 100)(rng)));
    const int victim = ranks[std::uniform_int_distribution<size_t>(0, 1)(rng)];
    ASSERT_EQ(::kill(victim, SIGKILL), 0) << "rank pid " << victim << " had already exited";
    old_ranks = ranks;
  }
  const int status = job.wait(std::chrono::seconds(240));
  const std::string out = job.output();
  ASSERT_EQ(status, 0) << out;
  for (int k = 1; k <= 3; ++k) {
    EXPECT_TRUE(contains(out, "fsdp launch: restart " + std::to_string(k) + " of 3 after: rank")) << out;
  }
  EXPECT_TRUE(contains(out, "was killed by SIGKILL")) << out;
  EXPECT_FALSE(contains(out, "restart 4")) << out;
  expect_same_weights(dir + "/straight/checkpoints/step_00000400", dir + "/restarted/checkpoints/step_00000400");
}
INSTANTIATE_TEST_SUITE_P(Saves, Restarts, ::testing::Bool(),
                         [](const auto& info) { return std::string(info.param ? "async" : "sync"); });

TEST(RestartsTogether, EveryNodesLauncherRestartsTogether) {
  const auto dir = make_temp_dir();
  const int port = dist::find_free_port();
  // Two launchers on this host as nodes 0 and 1; node 1's rank dies in the
  // first attempt, and node 0 restarts too, from the cause node 1 published.
  const std::string worker = "sh -c 'if [ \"$FSDP_RESTART_ATTEMPT\" = 0 ] && [ \"$RANK\" = 1 ]; then exit 3; fi; exec " +
                             kWorker + " ok'";
  const auto node = [&](int n) {
    return "env FSDP_TIMEOUT=20 " + kCli + " launch -n 1 --nnodes 2 --node-rank " + std::to_string(n) +
           " --master-port " + std::to_string(port) + " --max-restarts 1 --stop-grace 2 -- " + worker;
  };
  BackgroundCommand node0(node(0), dir + "/node0.log");
  const auto node1 = run_command(node(1));
  const int status0 = node0.wait(std::chrono::seconds(120));
  const std::string out0 = node0.output();
  EXPECT_EQ(node1.exit_code, 0) << node1.output;
  EXPECT_EQ(status0, 0) << out0;
  EXPECT_TRUE(contains(node1.output, "restart 1 of 1 after: rank 1 (pid")) << node1.output;
  EXPECT_TRUE(contains(out0, "node 1: rank 1 (pid")) << out0;
  EXPECT_TRUE(contains(out0, "restart 1 of 1 after: node 1: rank 1")) << out0;
  EXPECT_TRUE(contains(out0, "all_reduce completed")) << out0;
}

TEST(Restarts, ExhaustedRestartsFailNamingTheLastCause) {
  const auto r = run_command(kCli + " launch -n 2 --max-restarts 2 --stop-grace 2 -- " + kWorker + " die");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "restart 2 of 2 after: rank 1")) << r.output;
  EXPECT_TRUE(contains(r.output, "fsdp launch: failed: rank 1 (pid")) << r.output;
  EXPECT_TRUE(contains(r.output, "exited with code 7 (after 2 restarts)")) << r.output;
}

// Desyncs: the error names the collective, its number and the ranks on each side.
void expect_desync(const CommandResult& r, const std::vector<std::string>& needles) {
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "collectives out of step between ranks")) << r.output;
  for (const auto& n : needles) EXPECT_TRUE(contains(r.output, n)) << "expected '" << n << "' in\n" << r.output;
  EXPECT_FALSE(contains(r.output, "frame #")) << r.output;
  EXPECT_LT(r.seconds, 30) << "a desync must be reported, not waited out";
}

TEST(Desync, CollectivesOnDifferentGroupsAreCaughtByTheAlwaysOnCheck) {
  // Both collectives complete (each group pairs up), so only the step's
  // fingerprint can tell: rank 0 issued 'a' then 'b', rank 1 'b' then 'a'.
  const auto r = run_command("env FSDP_TIMEOUT=20 " + kCli + " launch -n 2 -- " + kWorker + " desync-groups");
  expect_desync(r, {"found at the end of the test step", "at collective #", "rank 0: all_reduce #",
                    "on group 'a'", "rank 1: all_reduce #", "on group 'b'"});
}

TEST(Desync, TheAlwaysOnCheckCanBeTurnedOff) {
  const auto r = run_command("env FSDP_DEBUG=off FSDP_TIMEOUT=20 " + kCli + " launch -n 2 -- " + kWorker +
                             " desync-groups");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(Desync, DetailCatchesADifferentSizeBeforeIssuingIt) {
  const auto r = run_command("env FSDP_DEBUG=detail FSDP_TIMEOUT=20 " + kCli + " launch -n 3 -- " + kWorker +
                             " desync-size");
  expect_desync(r, {"FSDP_DEBUG=detail, before issuing", "ranks 0,2: all_reduce #", "(1024 Float",
                    "rank 1: all_reduce #", "(1000 Float"});
}

TEST(Desync, DetailCatchesADifferentOrder) {
  const auto r = run_command("env FSDP_DEBUG=detail FSDP_TIMEOUT=20 " + kCli + " launch -n 2 -- " + kWorker +
                             " desync-order");
  expect_desync(r, {"rank 0: all_reduce #", "rank 1: broadcast #"});
}

TEST(Desync, DetailCatchesASkippedCollective) {
  // Rank 1 skips an all_reduce: its next collective, a barrier, meets rank 0's all_reduce.
  const auto r = run_command("env FSDP_DEBUG=detail FSDP_TIMEOUT=20 " + kCli + " launch -n 2 -- " + kWorker +
                             " desync-skip");
  expect_desync(r, {"rank 0: all_reduce #2", "rank 1: barrier #2"});
}

// Without FSDP_DEBUG=detail, ranks on one host that issue different
// collectives fail in the first round, each naming both: every round of
// the shared-memory transport carries what it is.
TEST(Desync, SharedMemoryNamesBothCollectivesWithoutDetail) {
  auto r = run_command("env FSDP_TIMEOUT=20 " + kCli + " launch -n 2 -- " + kWorker + " desync-size");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, 15);
  for (const char* needle : {"ranks issued different collectives", "all_reduce of 4000 bytes (Float)",
                             "all_reduce of 4096 bytes (Float)"}) {
    EXPECT_TRUE(contains(r.output, needle)) << needle << " in\n" << r.output;
  }
  r = run_command("env FSDP_TIMEOUT=20 " + kCli + " launch -n 2 -- " + kWorker + " desync-order");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "broadcast of 4096 bytes (Float) from root 0")) << r.output;
  EXPECT_TRUE(contains(r.output, "all_reduce of 4096 bytes (Float)")) << r.output;
}

TEST(Hang, ATimeoutEndsWithTheLaunchersSummaryOfWhereEachRankWaits) {
  // Rank 1 waits in a collective of a group rank 0 never uses: both hang
  // until the timeout.
  const auto r = run_command("env FSDP_TIMEOUT=3 " + kCli + " launch -n 2 -- " + kWorker + " stall");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.seconds, 40);
  EXPECT_TRUE(contains(r.output, "fsdp launch: where each rank was (flight records in ")) << r.output;
  // A rank that timed out "failed in" it; one stopped by the launcher first "waits in" it.
  for (const auto& [rank, group] : {std::pair<int, std::string>{0, "world"}, {1, "side"}}) {
    const std::string what = " all_reduce #2 on group '" + group + "' (256 Float, 1.0 KiB";
    const std::string who = "  rank " + std::to_string(rank);
    EXPECT_TRUE(contains(r.output, who + " failed in" + what) || contains(r.output, who + " waits in" + what))
        << r.output;
  }
  // One account, the launcher's: the rank(s) that timed out left their
  // recent collectives in a file (the other may have been stopped by the
  // launcher first) and did not print them too.
  EXPECT_EQ(occurrences(r.output, "where each rank was"), 1) << r.output;
  EXPECT_FALSE(contains(r.output, "the last collectives of this rank")) << r.output;
  EXPECT_TRUE(contains(r.output, "  last collectives of the rank(s) whose collective failed: ")) << r.output;
  const auto where = r.output.find("flight records in ") + 18;
  const std::string folder = r.output.substr(where, r.output.find(')', where) - where);
  const std::string dumps = read_file(folder + "/rank0.txt") + read_file(folder + "/rank1.txt");
  EXPECT_TRUE(contains(dumps, "all_reduce #1 on group 'world' (256 Float, 1.0 KiB): done in")) << dumps;
  EXPECT_TRUE(contains(dumps, "all_reduce #2 on group '")) << dumps;
  EXPECT_TRUE(contains(dumps, "(256 Float, 1.0 KiB): FAILED")) << dumps;
  fs::remove_all(folder);
}

TEST(Hang, ARankKilledInACollectiveIsReportedDeadOnceNotWaiting) {
  // Both ranks wait in all_reduce #2 (on different groups, as in `stall`);
  // then rank 1 is killed with SIGKILL. Rank 0's all_reduce fails when its
  // peer's connection goes; the launcher tells, once, that rank 1 died there.
  const auto dir = make_temp_dir();
  BackgroundCommand job("env FSDP_TIMEOUT=60 FSDP_FLIGHT_RECORDER_DIR=" + dir + " " + kCli + " launch -n 2 -- " +
                            kWorker + " stall",
                        dir + "/launch.log");
  std::optional<dist::RankRecord> victim;
  for (int i = 0; i < 600; ++i) {
    const auto r0 = dist::read_rank_record(dir, 0);
    const auto r1 = dist::read_rank_record(dir, 1);
    if (r0 && r1 && r0->entries.size() == 2 && r1->entries.size() == 2 && r1->entries.back().in_flight()) {
      victim = r1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(victim.has_value()) << "rank 1 never waited in its second all_reduce\n" << job.output();
  ASSERT_GT(victim->pid, 0);
  ::kill(victim->pid, SIGKILL);
  const int status = job.wait(std::chrono::seconds(60));
  const std::string out = job.output();
  EXPECT_NE(status, 0) << out;
  EXPECT_TRUE(contains(out, "was killed by SIGKILL")) << out;
  EXPECT_TRUE(contains(out, "  rank 1 is dead (killed by signal 9, SIGKILL); its last collective, in flight when it "
                            "died: all_reduce #2 on group 'side' (256 Float, 1.0 KiB), issued "))
      << out;
  EXPECT_FALSE(contains(out, "rank 1 waits in")) << out;
  // Printed once: one summary, no rank's own dump beside it (rank 0's is in rank0.txt).
  EXPECT_EQ(occurrences(out, "where each rank was"), 1) << out;
  EXPECT_FALSE(contains(out, "the last collectives of this rank")) << out;
  EXPECT_EQ(occurrences(out, "all_reduce #1 on group 'world'"), 0) << "a dump was printed\n" << out;
  fs::remove_all(dir);
}

TEST(Hang, AStoppedRankIsNamedAsStoppedNotTheHealthyRankThatTimedOut) {
  // Rank 1 is stopped (SIGSTOP, as Ctrl-Z or a debugger would) while both
  // train: rank 0 times out waiting for it. The launcher names rank 1 as
  // the cause, says it was stopped (not waiting), and does not wait out
  // the whole --stop-grace for a rank that cannot act on SIGTERM.
  const auto dir = make_temp_dir();
  BackgroundCommand job("env FSDP_TIMEOUT=4 FSDP_FLIGHT_RECORDER_DIR=" + dir + " " + kCli +
                            " launch -n 2 --stop-grace 60 -- " + kCli +
                            " train --model gpt2-tiny --data synthetic --seq-len 16 --batch-size 2 --steps 100000 "
                            "--log-every 1 --out-dir " + dir + "/run",
                        dir + "/launch.log");
  std::optional<dist::RankRecord> rank1;
  for (int i = 0; i < 600; ++i) {
    rank1 = dist::read_rank_record(dir, 1);
    if (rank1 && rank1->entries.size() > 20) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(rank1 && rank1->pid > 0) << job.output();
  ::kill(rank1->pid, SIGSTOP);
  const auto stopped_at = std::chrono::steady_clock::now();
  const int status = job.wait(std::chrono::seconds(90));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  const std::string out = job.output();
  EXPECT_NE(status, 0) << out;
  EXPECT_TRUE(contains(out, "fsdp launch: failed: rank 1 (pid " + std::to_string(rank1->pid) +
                                ") was stopped (SIGSTOP, Ctrl-Z or a debugger) and held the others, until rank 0"))
      << out;
  EXPECT_TRUE(contains(out, "  rank 1 was stopped (SIGSTOP, Ctrl-Z or a debugger) while the others waited for it"))
      << out;
  EXPECT_FALSE(contains(out, "rank 1 waits in")) << out;
  EXPECT_LT(seconds, 40) << "the launcher waited out --stop-grace 60 for the stopped rank\n" << out;
  fs::remove_all(dir);
}

TEST(Signals, SigintStopsTrainingCleanlyAndTheLauncherExits130) {
  // Ctrl-C (or a scheduler's preemption) is a request: every rank finishes
  // its step, saves and exits 130 (128 + SIGINT), and so does the launcher,
  // as torchrun and shells do: `fsdp launch ... && fsdp ckpt export` stops.
  const auto dir = make_temp_dir();
  BackgroundCommand job(kCli + " launch -n 2 -- " + kCli +
                            " train --model gpt2-tiny --data synthetic --seq-len 16 --batch-size 2 --steps 100000 "
                            "--log-every 1 --out-dir " + dir + "/run --metrics " + dir + "/metrics.jsonl --ckpt-dir " +
                            dir + "/ckpt",
                        dir + "/launch.log");
  for (int i = 0; i < 600 && train_losses(read_metrics(dir + "/metrics.jsonl")).size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(train_losses(read_metrics(dir + "/metrics.jsonl")).size(), 2u) << job.output();
  ::kill(job.pid(), SIGINT);
  const int status = job.wait(std::chrono::seconds(120));
  const std::string out = job.output();
  EXPECT_EQ(status, 130) << out;
  EXPECT_TRUE(contains(out, "fsdp launch: received SIGINT; forwarding it to the ranks")) << out;
  EXPECT_TRUE(contains(out, "[rank 0] stopped by SIGINT after step ")) << out;
  EXPECT_TRUE(contains(out, "fsdp launch: every rank stopped cleanly after SIGINT (exit 130)")) << out;
  EXPECT_TRUE(exists(dir + "/ckpt/latest")) << "the stop saved no checkpoint\n" << out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fsdp::testing::reliability_test

namespace fsdp::testing::reliability_test {
namespace {

// Runs `script` in a mount namespace of its own with a 800 KiB tmpfs at
// $DISK (gone when the script ends); nullopt where one cannot be made.
std::optional<CommandResult> with_small_disk(const std::string& script) {
  const auto probe = run_command("unshare -m sh -c 'mount -t tmpfs -o size=4k tmpfs /mnt' 2>&1");
  if (probe.exit_code != 0) return std::nullopt;
  const auto dir = make_temp_dir();
  return run_command("unshare -m sh -c 'DISK=" + dir + "; mount -t tmpfs -o size=800k tmpfs $DISK && " + script + "'");
}

// A save into a filesystem that fills up (the first checkpoint fits, the
// second does not).
std::string full_disk_run(const std::string& on_error, const std::string& out) {
  return "env FSDP_TIMEOUT=20 " + kCli + " launch -n 2 -- " + kCli +
         " train --model gpt2-tiny --data synthetic --seq-len 16 --batch-size 2 --steps 8 --save-every 2 "
         "--log-every 4 --ckpt-dir $DISK/ckpt --on-save-error " + on_error + " --out-dir " + out +
         "; echo EXIT=$?; ls $DISK/ckpt; echo LATEST=$(cat $DISK/ckpt/latest)";
}

TEST(FullDisk, ASaveThatFillsTheDiskStopsCleanlyAndLeavesTheLastCheckpoint) {
  const auto dir = make_temp_dir();
  const auto r = with_small_disk(full_disk_run("stop", dir + "/run"));
  if (!r) GTEST_SKIP() << "cannot mount a tmpfs in a mount namespace here (needs CAP_SYS_ADMIN)";
  EXPECT_TRUE(contains(r->output, "EXIT=1")) << r->output;
  EXPECT_TRUE(contains(r->output, "saving checkpoint '")) << r->output;
  EXPECT_TRUE(contains(r->output, "step_00000004.tmp' failed on rank ")) << r->output;
  EXPECT_TRUE(contains(r->output, "No space left on device")) << r->output;
  EXPECT_TRUE(contains(r->output, "Stopping (--on-save-error stop)")) << r->output;
  EXPECT_TRUE(contains(r->output, "LATEST=step_00000002")) << r->output;
  const std::string listing = r->output.substr(r->output.find("EXIT="));
  EXPECT_FALSE(contains(listing, "step_00000004")) << "partial files left:\n" << listing;
  EXPECT_FALSE(contains(r->output, "where each rank was")) << "a clean error needs no flight records\n" << r->output;
}

TEST(FullDisk, OnSaveErrorContinueTrainsOnAndWarns) {
  const auto dir = make_temp_dir();
  const auto r = with_small_disk(full_disk_run("continue", dir + "/run"));
  if (!r) GTEST_SKIP() << "cannot mount a tmpfs in a mount namespace here (needs CAP_SYS_ADMIN)";
  EXPECT_TRUE(contains(r->output, "EXIT=0")) << r->output;
  EXPECT_TRUE(contains(r->output, "warning: saving checkpoint '")) << r->output;
  EXPECT_TRUE(contains(r->output, "training on (--on-save-error continue)")) << r->output;
  EXPECT_TRUE(contains(r->output, "step 8/8")) << r->output;
  EXPECT_TRUE(contains(r->output, "checkpoint save(s) failed in this run")) << r->output;
  EXPECT_TRUE(contains(r->output, "LATEST=step_00000002")) << r->output;
  const std::string listing = r->output.substr(r->output.find("EXIT="));
  EXPECT_FALSE(contains(listing, ".tmp")) << listing;
  int failures = 0;
  for (const auto& m : read_metrics(dir + "/run/metrics.jsonl")) failures += m.value("event", "") == "checkpoint_failed";
  EXPECT_GE(failures, 2) << "steps 4, 6 and the final save each fail";
}

}  // namespace
}  // namespace fsdp::testing::reliability_test

namespace fsdp::testing::reliability_test {
namespace {

// Two "hosts": network namespaces joined by a veth pair, 10.213.0.1 (A) and
// 10.213.0.2 (B). Removed, with the pair, when destroyed.
class TwoHosts {
 public:
  TwoHosts() {
    const std::string id = std::to_string(::getpid() % 100000);
    a_ = "fsdpA" + id;
    b_ = "fsdpB" + id;
    va_ = "fva" + id;
    vb_ = "fvb" + id;
    const std::string setup = "ip netns add " + a_ + " && ip netns add " + b_ + " && ip link add " + va_ +
                              " type veth peer name " + vb_ + " && ip link set " + va_ + " netns " + a_ +
                              " && ip link set " + vb_ + " netns " + b_ + " && ip -n " + a_ +
                              " addr add 10.213.0.1/24 dev " + va_ + " && ip -n " + b_ +
                              " addr add 10.213.0.2/24 dev " + vb_ + " && ip -n " + a_ + " link set " + va_ +
                              " up && ip -n " + b_ + " link set " + vb_ + " up && ip -n " + a_ +
                              " link set lo up && ip -n " + b_ + " link set lo up";
    const auto r = run_command(setup);
    ok_ = r.exit_code == 0;
    why_ = r.output;
  }
  ~TwoHosts() { run_command("ip netns del " + a_ + "; ip netns del " + b_); }

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  // `command` as node n (0 on A, 1 on B) of `fsdp launch --nnodes 2`. Each
  // "host" gets a /dev/shm of its own, as hosts have, so the ranks cannot
  // reach each other through shared memory and the groups keep Gloo's TCP.
  std::string node(int n, int port, const std::string& command) const {
    return "ip netns exec " + (n == 0 ? a_ : b_) +
           " sh -c 'mount -t tmpfs tmpfs /dev/shm && exec env GLOO_SOCKET_IFNAME=" + (n == 0 ? va_ : vb_) + " FSDP_TIMEOUT=5 " + kCli + " launch -n 1 --nnodes 2 --node-rank " +
           std::to_string(n) + " --master-addr 10.213.0.1 --master-port " + std::to_string(port) +
           " --stop-grace 2 -- " + command + "'";
  }
  void link(bool up) const { run_command("ip -n " + a_ + " link set " + va_ + (up ? " up" : " down")); }

 private:
  std::string a_, b_, va_, vb_, why_;
  bool ok_ = false;
};

TEST(TwoHosts, TrainAcrossTwoNamespacesThenSurviveALinkCut) {
  TwoHosts hosts;
  if (!hosts.ok()) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2): " << hosts.why();
  const auto dir = make_temp_dir();
  const auto corpus = small_corpus(dir);
  const std::string train = kCli + " train --model gpt2-tiny --seq-len 16 --batch-size 2 --lr 1e-3 --log-every 1 "
                                   "--data " + corpus;

  // Losses across the two hosts (Gloo's TCP) equal those of two ranks on one
  // host (shared memory): at W = 2 both sum the same two values.
  const auto one = run_command(kCli + " launch -n 2 -- " + train + " --steps 6 --out-dir " + dir + "/one");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  {
    BackgroundCommand node1(hosts.node(1, 29611, train + " --steps 6 --out-dir " + dir + "/two"), dir + "/n1.log");
    const auto node0 = run_command(hosts.node(0, 29611, train + " --steps 6 --out-dir " + dir + "/two"));
    ASSERT_EQ(node0.exit_code, 0) << node0.output;
    ASSERT_EQ(node1.wait(std::chrono::seconds(60)), 0) << node1.output();
  }
  const auto one_host = train_losses(read_metrics(dir + "/one/metrics.jsonl"));
  const auto two_hosts = train_losses(read_metrics(dir + "/two/metrics.jsonl"));
  ASSERT_EQ(one_host.size(), 6u);
  ASSERT_EQ(two_hosts.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(one_host[i], two_hosts[i]) << "step " << i + 1;

  // The link goes down mid-run: both sides fail within the timeout (5 s),
  // naming the peer; once it is back, the same commands resume from `latest`.
  const std::string run = train + " --steps 100000 --save-every 5 --out-dir " + dir + "/cut";
  BackgroundCommand node0(hosts.node(0, 29612, run), dir + "/cut0.log");
  BackgroundCommand node1(hosts.node(1, 29612, run), dir + "/cut1.log");
  for (int i = 0; i < 600 && !exists(dir + "/cut/checkpoints/latest"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(exists(dir + "/cut/checkpoints/latest")) << node0.output();
  hosts.link(false);
  const auto cut_at = std::chrono::steady_clock::now();
  const int status0 = node0.wait(std::chrono::seconds(60));
  const int status1 = node1.wait(std::chrono::seconds(60));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut_at).count();
  EXPECT_NE(status0, 0);
  EXPECT_NE(status1, 0);
  EXPECT_LT(seconds, 5 + 10) << "the timeout is 5 s";
  EXPECT_TRUE(contains(node0.output(), "peers: rank 1 at 10.213.0.2")) << node0.output();
  EXPECT_TRUE(contains(node1.output(), "peers: rank 0 at 10.213.0.1")) << node1.output();
  // Each rank's log keeps the error and its last collectives.
  for (int rank : {0, 1}) {
    const std::string log = read_file(dir + "/cut/logs/rank" + std::to_string(rank) + ".log");
    EXPECT_TRUE(contains(log, "error: ")) << log;
    EXPECT_TRUE(contains(log, "last collectives of this rank (flight recorder):")) << log;
    EXPECT_TRUE(contains(log, "FAILED, issued")) << log;
  }
  const std::string latest = read_file(dir + "/cut/checkpoints/latest").substr(0, 13);  // "step_NNNNNNNN"
  const int saved = std::stoi(latest.substr(5));
  hosts.link(true);
  const std::string resume = train + " --steps " + std::to_string(saved + 2) + " --out-dir " + dir + "/cut";
  BackgroundCommand again1(hosts.node(1, 29613, resume), dir + "/again1.log");
  const auto again0 = run_command(hosts.node(0, 29613, resume));
  EXPECT_EQ(again0.exit_code, 0) << again0.output;
  EXPECT_EQ(again1.wait(std::chrono::seconds(60)), 0) << again1.output();
  EXPECT_TRUE(contains(again0.output, "resumed from " + dir + "/cut/checkpoints/" + latest)) << again0.output;
}

}  // namespace
}  // namespace fsdp::testing::reliability_test
