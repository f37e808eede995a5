#include "fsdp/launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/common/error.h"
#include "fsdp/distributed/flight_recorder.h"
#include "fsdp/distributed/launch_env.h"
#include "fsdp/io/remove_tree.h"

namespace fsdp::launch {
namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_received_signal = 0;
volatile std::sig_atomic_t g_signal_count = 0;

void on_signal(int sig) {
  g_received_signal = sig;
  g_signal_count = g_signal_count + 1;
}

void write_all(int fd, const std::string& text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // the terminal went away; nothing sensible to do
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// One rank's output stream (stdout or stderr), cut into prefixed lines.
struct OutputPipe {
  int fd = -1;
  int target_fd = 1;
  std::string pending;
};

struct Rank {
  int global_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int signal_sent = 0;                     // the last signal the launcher sent it
  std::optional<std::string> ended_badly;  // "exited with code 3", "was killed by SIGKILL"; unset for exit 0
  int died_of_signal = 0;                  // the signal that killed it, when the launcher did not send it
  bool stopped_at_failure = false;         // stopped (SIGSTOP, Ctrl-Z) when another rank's failure was seen
  int exit_code = -1;                      // when it exited (not killed)
  OutputPipe out, err;
};

// Whether `pid` is stopped (state T) or stopped by a tracer (t).
bool is_stopped(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return false;
  char line[512] = {};
  const bool read = std::fgets(line, sizeof(line), f) != nullptr;
  std::fclose(f);
  const char* close = read ? std::strrchr(line, ')') : nullptr;
  return close != nullptr && close[1] == ' ' && (close[2] == 'T' || close[2] == 't');
}

// [Note: restarts]
// With --max-restarts N, node 0's launcher serves the job's store on
// --master-port and the ranks of every node rendezvous in it (each attempt
// under its own prefix) instead of rank 0 serving one. A launcher whose rank
// fails writes the cause under restart/<attempt>/ and stops its ranks; the
// others see it within half a second and stop theirs; each then counts
// itself in restart/<attempt>/stopped and, when all nodes have, starts
// attempt+1. The ranks resume from their latest checkpoint by themselves
// (`fsdp train` does when its run folder holds one; FSDP_RUN_STARTED keeps
// the default folder name the same across attempts).
class Supervisor {
 public:
  explicit Supervisor(const LaunchOptions& options) : options_(options) {}

  int run() {
    install_signal_handlers();
    started_at_s_ = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
    port_ = options_.master_port > 0 ? options_.master_port : dist::find_free_port();
    open_recorder_dir();
    if (options_.max_restarts > 0) {
      FSDP_CHECK(options_.open_job_store, "fsdp launch: --max-restarts needs a job store (not in this build)");
      store_ = options_.open_job_store(options_.master_addr, port_, options_.node_rank == 0, options_.nnodes);
    }
    for (attempt_ = 0;; ++attempt_) {
      start_ranks();
      loop();
      if (!failure_) break;
      report_flight_records();
      if (forwarded_signal_ != 0 || attempt_ >= options_.max_restarts) break;
      agree_all_stopped();
      write_all(STDERR_FILENO, "fsdp launch: restart " + std::to_string(attempt_ + 1) + " of " +
                                   std::to_string(options_.max_restarts) + " after: " + *failure_ + "\n");
      reset_for_next_attempt();
    }
    if (!failure_ && forwarded_signal_ == 0) wait_for_other_nodes_to_finish();
    const int code = exit_code();
    // The flight records stay for a job that failed or did not stop cleanly.
    // See [Note: no std::filesystem::remove_all]; a folder left behind in
    // the temporary directory is no reason to fail a job that succeeded.
    std::error_code ignored;
    if (code == 0 && own_recorder_dir_) io::remove_tree(recorder_dir_, ignored);
    return code;
  }

 private:
  // The ranks' flight records go to a folder the launcher reads after a
  // failure (see [Note: flight recorder file]); kept when something failed.
  void open_recorder_dir() {
    if (const char* dir = std::getenv("FSDP_FLIGHT_RECORDER_DIR"); dir != nullptr && *dir != '\0') {
      recorder_dir_ = dir;
      return;
    }
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/fsdp-launch-XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) {
      recorder_dir_ = pattern;
      own_recorder_dir_ = true;
    }
  }

  // Once per failed attempt, the one account of where each rank was (see
  // [Note: one account of a failure] in flight_recorder.h).
  void report_flight_records() {
    if (recorder_dir_.empty()) return;
    std::vector<dist::RankRecord> records;
    std::vector<std::string> text_dumps;
    for (const auto& rank : ranks_) {
      auto r = dist::read_rank_record(recorder_dir_, rank.global_rank);
      if (!r) continue;
      r->killed_by_signal = rank.died_of_signal;
      r->stopped = rank.stopped_at_failure;
      records.push_back(std::move(*r));
      const std::string dump = dist::text_dump_path(recorder_dir_, rank.global_rank);
      if (std::filesystem::exists(dump)) text_dumps.push_back(dump);
    }
    // Only a rank stuck or failed in a collective needs explaining.
    const bool collective_trouble = std::any_of(records.begin(), records.end(), [](const dist::RankRecord& r) {
      return std::any_of(r.entries.begin(), r.entries.end(), [](const dist::FlightEntry& e) { return e.completed_ns <= 0; });
    });
    if (!collective_trouble) return;
    std::string text = "fsdp launch: where each rank was (flight records in " + recorder_dir_ + "):\n";
    for (const auto& line : dist::summarize_ranks(records, dist::system_now_ns())) text += "  " + line + "\n";
    if (!text_dumps.empty()) {
      std::string list;
      for (const auto& d : text_dumps) list += (list.empty() ? "" : ", ") + d;
      text += "  last collectives of the rank(s) whose collective failed: " + list + "\n";
    }
    write_all(STDERR_FILENO, text);
  }

  std::string restart_key(const std::string& what) const {
    return "restart/" + std::to_string(attempt_) + "/" + what;
  }

  // Tells the other nodes' launchers that this attempt failed here.
  void publish_failure() {
    if (!store_) return;
    try {
      store_->set(restart_key("cause"), "node " + std::to_string(options_.node_rank) + ": " + *failure_);
      store_->add(restart_key("failed"), 1);
    } catch (const std::exception& e) {
      write_all(STDERR_FILENO, std::string("fsdp launch: cannot reach the job store: ") + e.what() + "\n");
    }
  }

  // Whether another node reported a failure of this attempt.
  void poll_remote_failure() {
    if (!store_ || stopping_ || Clock::now() < next_store_poll_) return;
    next_store_poll_ = Clock::now() + std::chrono::milliseconds(500);
    try {
      if (store_->add(restart_key("failed"), 0) == 0) return;
      failure_ = store_->get_if_set(restart_key("cause")).value_or("another node failed");
    } catch (const std::exception& e) {
      failure_ = std::string("lost the job store at ") + options_.master_addr + ":" + std::to_string(port_) +
                 " (node 0's launcher): " + e.what();
    }
    write_all(STDERR_FILENO, "fsdp launch: " + *failure_ + "; stopping this node's ranks\n");
    begin_stop(SIGTERM);
  }

  // Every node has stopped its ranks before any starts the next attempt.
  void agree_all_stopped() {
    if (!store_) return;
    const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<long>(options_.stop_grace_s * 1000)) +
                          std::chrono::seconds(60);
    store_->add(restart_key("stopped"), 1);
    while (store_->add(restart_key("stopped"), 0) < options_.nnodes) {
      FSDP_CHECK(Clock::now() < deadline, "fsdp launch: not every node stopped its ranks after attempt ", attempt_,
                 " failed; giving up on restarts");
      ::usleep(100 * 1000);
    }
  }

  // Node 0 serves the store: it stays until every node's ranks are done, so
  // a node still finishing never finds the store gone and takes it for a failure.
  void wait_for_other_nodes_to_finish() {
    if (!store_) return;
    try {
      store_->add(restart_key("finished"), 1);
      if (options_.node_rank != 0) return;
      const auto deadline = Clock::now() + std::chrono::seconds(300);
      while (store_->add(restart_key("finished"), 0) < options_.nnodes && Clock::now() < deadline &&
             store_->add(restart_key("failed"), 0) == 0) {
        ::usleep(100 * 1000);
      }
    } catch (const std::exception&) {
      // Our ranks succeeded; the store is only coordination.
    }
  }

  void reset_for_next_attempt() {
    ranks_.clear();
    failure_.reset();
    stopping_ = false;
    killed_ = false;
    stop_deadline_.reset();
  }

  void install_signal_handlers() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);
  }

  // [Note: pinned threads]
  // Without binding, the OpenMP threads of all ranks migrate over every
  // core, and ranks' matmuls evict each other's caches. A rank with two or
  // more threads gets its own slice of the allowed CPUs. A rank with one
  // thread is left unbound: binding the main thread also confines the Gloo
  // threads it starts to that one core. Measured on 2 cores, GPT-2 d6
  // (tokens/s, two interleaved runs each): W=1 with 2 threads 850, 780
  // pinned versus 843, 746 not; W=2 with 1 thread each 827, 825 pinned
  // versus 836, 843 not. The user's own placement wins (OMP_PROC_BIND,
  // OMP_PLACES, GOMP_CPU_AFFINITY, KMP_AFFINITY, or OMP_NUM_THREADS), and
  // FSDP_PIN_THREADS=0 turns it off.
  static bool pin_threads() {
    for (const char* key : {"OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY"}) {
      if (std::getenv(key) != nullptr) return false;
    }
    const char* pin = std::getenv("FSDP_PIN_THREADS");
    return pin == nullptr || std::string(pin) != "0";
  }

  std::vector<std::string> child_env(int local_rank, int global_rank) const {
    const int world = options_.nproc_per_node * options_.nnodes;
    const int threads = options_.threads_per_rank > 0
                            ? options_.threads_per_rank
                            : std::max(1, available_cores() / options_.nproc_per_node);
    std::vector<std::string> env;
    const auto set = [&](const std::string& k, const std::string& v) { env.push_back(k + "=" + v); };
    set("RANK", std::to_string(global_rank));
    set("LOCAL_RANK", std::to_string(local_rank));
    set("GROUP_RANK", std::to_string(options_.node_rank));
    set("WORLD_SIZE", std::to_string(world));
    set("LOCAL_WORLD_SIZE", std::to_string(options_.nproc_per_node));
    set("MASTER_ADDR", options_.master_addr);
    set("MASTER_PORT", std::to_string(port_));
    set("FSDP_RUN_STARTED", std::to_string(started_at_s_));
    set(dist::kRestartAttemptVar, std::to_string(attempt_));
    set("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt_));
    set("TORCHELASTIC_MAX_RESTARTS", std::to_string(options_.max_restarts));
    if (store_) set(dist::kAgentStoreVar, "1");
    if (!recorder_dir_.empty()) {
      set("FSDP_FLIGHT_RECORDER_DIR", recorder_dir_);
      set(dist::kLauncherReadsRecordsVar, "1");
    }
    // Programs that prefix their own error lines with the rank need not.
    if (options_.prefix_output) set("FSDP_LAUNCH_PREFIXES_LINES", "1");
    // Respect a user's explicit thread count; otherwise divide the cores,
    // and keep each rank's threads on its own (see [Note: pinned threads]).
    if (std::getenv("OMP_NUM_THREADS") != nullptr) return env;
    set("OMP_NUM_THREADS", std::to_string(threads));
    if (threads >= 2 && pin_threads()) {
      const std::string places = omp_places_for(allowed_cpus(), local_rank, options_.nproc_per_node, threads);
      if (!places.empty()) {
        set("OMP_PLACES", places);
        set("OMP_PROC_BIND", "close");
      }
    }
    return env;
  }

  void start_ranks() {
    for (int local = 0; local < options_.nproc_per_node; ++local) {
      Rank rank;
      rank.global_rank = options_.node_rank * options_.nproc_per_node + local;
      // An earlier attempt's dump is not this attempt's.
      if (!recorder_dir_.empty()) ::unlink(dist::text_dump_path(recorder_dir_, rank.global_rank).c_str());
      int out_pipe[2], err_pipe[2];
      FSDP_CHECK(::pipe2(out_pipe, O_CLOEXEC) == 0 && ::pipe2(err_pipe, O_CLOEXEC) == 0,
                 "fsdp launch: pipe failed: ", std::strerror(errno));
      const auto env = child_env(local, rank.global_rank);
      // Until the child has reset SIGINT/SIGTERM to their defaults, a signal
      // forwarded to it would run the launcher's handler in the child and be
      // lost; keep them blocked across fork, so they stay pending instead.
      sigset_t stop_signals, previous;
      sigemptyset(&stop_signals);
      sigaddset(&stop_signals, SIGINT);
      sigaddset(&stop_signals, SIGTERM);
      ::sigprocmask(SIG_BLOCK, &stop_signals, &previous);
      const pid_t pid = ::fork();
      if (pid == 0) {
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        ::sigprocmask(SIG_SETMASK, &previous, nullptr);
        exec_child(out_pipe[1], err_pipe[1], env);
      }
      ::sigprocmask(SIG_SETMASK, &previous, nullptr);
      FSDP_CHECK(pid >= 0, "fsdp launch: fork failed: ", std::strerror(errno));
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
      ::setpgid(pid, pid);  // also done in the child: whichever runs first wins the race
      rank.pid = pid;
      rank.running = true;
      rank.out = {out_pipe[0], STDOUT_FILENO, {}};
      rank.err = {err_pipe[0], STDERR_FILENO, {}};
      ranks_.push_back(std::move(rank));
    }
  }

  [[noreturn]] void exec_child(int out_fd, int err_fd, const std::vector<std::string>& env) {
    // Own process group: the launcher forwards terminal signals itself, and
    // stopping a rank stops whatever it spawned.
    ::setpgid(0, 0);
    // A rank dies with its launcher: killed (kill -9, the OOM killer), the
    // launcher can no longer stop its ranks, which would train on
    // unsupervised, keep the run folder locked and save checkpoints nobody
    // waits for. The check after it covers a launcher that died first.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher_pid_) ::_exit(128 + SIGKILL);
    signal(SIGPIPE, SIG_DFL);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    for (const auto& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> argv;
    for (const auto& a : options_.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    const std::string msg = "fsdp launch: cannot run '" + options_.command[0] + "': " + std::strerror(errno) + "\n";
    write_all(STDERR_FILENO, msg);
    ::_exit(127);
  }

  void loop() {
    while (true) {
      pump_output(100);
      reap();
      poll_remote_failure();
      if (g_received_signal != 0 && !forwarded_signal_) forward_signal(g_received_signal);
      // A second Ctrl-C means "now": no more grace.
      if (g_signal_count > 1 && !killed_) {
        signal_running(SIGKILL);
        killed_ = true;
      }
      const bool any_running = std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; });
      if (!any_running) break;
      if (stop_deadline_ && Clock::now() > *stop_deadline_ && !killed_) {
        signal_running(SIGKILL);
        killed_ = true;
      }
    }
    // Children are gone; drain what they wrote (grandchildren may still hold a
    // pipe open, so bound the wait).
    const auto drain_until = Clock::now() + std::chrono::milliseconds(500);
    while (open_pipes() > 0 && Clock::now() < drain_until) pump_output(50);
    for (auto& rank : ranks_) {
      flush_pipe(rank, rank.out);
      flush_pipe(rank, rank.err);
    }
  }

  int open_pipes() const {
    int n = 0;
    for (const auto& r : ranks_) n += (r.out.fd >= 0) + (r.err.fd >= 0);
    return n;
  }

  void pump_output(int timeout_ms) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, OutputPipe*>> owners;
    for (auto& rank : ranks_) {
      for (OutputPipe* pipe : {&rank.out, &rank.err}) {
        if (pipe->fd < 0) continue;
        fds.push_back({pipe->fd, POLLIN, 0});
        owners.emplace_back(&rank, pipe);
      }
    }
    if (fds.empty()) {
      ::usleep(static_cast<useconds_t>(timeout_ms) * 1000);
      return;
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;  // timeout or EINTR
    for (size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      auto [rank, pipe] = owners[i];
      char buf[65536];
      const ssize_t n = ::read(pipe->fd, buf, sizeof(buf));
      if (n > 0) {
        pipe->pending.append(buf, static_cast<size_t>(n));
        emit_lines(*rank, *pipe);
      } else if (n == 0 || errno != EINTR) {
        ::close(pipe->fd);
        pipe->fd = -1;
      }
    }
  }

  std::string prefix(const Rank& rank) const {
    return options_.prefix_output ? "[rank " + std::to_string(rank.global_rank) + "] " : "";
  }

  void emit_lines(const Rank& rank, OutputPipe& pipe) {
    size_t start = 0;
    std::string text;
    for (size_t nl; (nl = pipe.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      text += prefix(rank);
      text.append(pipe.pending, start, nl - start + 1);
    }
    pipe.pending.erase(0, start);
    if (!text.empty()) write_all(pipe.target_fd, text);
  }

  void flush_pipe(const Rank& rank, OutputPipe& pipe) {
    if (pipe.fd >= 0) {
      ::close(pipe.fd);
      pipe.fd = -1;
    }
    if (!pipe.pending.empty()) {
      write_all(pipe.target_fd, prefix(rank) + pipe.pending + "\n");
      pipe.pending.clear();
    }
  }

  void reap() {
    for (auto& rank : ranks_) {
      if (!rank.running) continue;
      int status = 0;
      const pid_t r = ::waitpid(rank.pid, &status, WNOHANG);
      if (r != rank.pid) continue;
      rank.running = false;
      // A rank's helpers (a shell's children, say) go with it.
      ::kill(-rank.pid, SIGKILL);
      std::optional<std::string> cause;
      if (WIFEXITED(status)) rank.exit_code = WEXITSTATUS(status);
      if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        cause = "exited with code " + std::to_string(WEXITSTATUS(status));
      } else if (WIFSIGNALED(status)) {
        cause = "was killed by " + signal_name(WTERMSIG(status));
        if (WTERMSIG(status) != rank.signal_sent) rank.died_of_signal = WTERMSIG(status);
      }
      rank.ended_badly = cause;
      if (cause && !failure_ && !stopping_) {
        failure_ = "rank " + std::to_string(rank.global_rank) + " (pid " + std::to_string(rank.pid) + ") " + *cause;
        // A stopped rank fails nothing itself: the others time out waiting
        // for it, and the first of them to exit would take the blame.
        std::string stopped;
        for (auto& other : ranks_) {
          if (!other.running || !is_stopped(other.pid)) continue;
          other.stopped_at_failure = true;
          stopped += (stopped.empty() ? "" : ", ") + std::to_string(other.global_rank) + " (pid " +
                     std::to_string(other.pid) + ")";
        }
        if (!stopped.empty()) {
          failure_ = "rank " + stopped + " was stopped (SIGSTOP, Ctrl-Z or a debugger) and held the others, " +
                     "until " + *failure_;
        }
        const int survivors = static_cast<int>(
            std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& x) { return x.running; }));
        write_all(STDERR_FILENO, "fsdp launch: " + *failure_ +
                                     (survivors > 0 ? "; stopping the other " + std::to_string(survivors) +
                                                          " rank(s)\n"
                                                    : "\n"));
        publish_failure();
        begin_stop(SIGTERM);
      }
    }
  }

  void signal_running(int sig) {
    for (auto& rank : ranks_) {
      if (!rank.running) continue;
      rank.signal_sent = sig;
      ::kill(-rank.pid, sig);
      // A stopped rank acts on SIGTERM or SIGINT only once continued; left
      // stopped, it would cost the whole --stop-grace.
      if (sig != SIGKILL && is_stopped(rank.pid)) ::kill(-rank.pid, SIGCONT);
    }
  }

  void begin_stop(int sig) {
    stopping_ = true;
    signal_running(sig);
    stop_deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<long>(options_.stop_grace_s * 1000));
  }

  void forward_signal(int sig) {
    forwarded_signal_ = sig;
    write_all(STDERR_FILENO, "fsdp launch: received " + signal_name(sig) + "; forwarding it to the ranks\n");
    begin_stop(sig);
  }

  int exit_code() const {
    if (failure_) {
      const std::string after =
          attempt_ > 0 ? " (after " + std::to_string(attempt_) + " restart" + (attempt_ > 1 ? "s" : "") + ")" : "";
      write_all(STDERR_FILENO, "fsdp launch: failed: " + *failure_ + after + "\n");
      return 1;
    }
    if (forwarded_signal_ != 0) {
      // Stopped on request: clean when every rank exited 0 or, as `fsdp
      // train` does after saving, 128 + the signal. Either way the launcher
      // exits 128 + the signal, as torchrun and shells do, so that
      // `fsdp launch ... && next-step` does not go on after a Ctrl-C.
      std::string unclean;
      for (const auto& rank : ranks_) {
        if (!rank.ended_badly || rank.exit_code == 128 + forwarded_signal_) continue;
        unclean += (unclean.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank.global_rank) + " (pid " +
                   std::to_string(rank.pid) + ") " + *rank.ended_badly;
      }
      const std::string sig = signal_name(forwarded_signal_);
      if (unclean.empty()) {
        write_all(STDERR_FILENO, "fsdp launch: every rank stopped cleanly after " + sig + " (exit " +
                                     std::to_string(128 + forwarded_signal_) + ")\n");
        return 128 + forwarded_signal_;
      }
      write_all(STDERR_FILENO, "fsdp launch: stopped by " + sig + ", not cleanly: " + unclean + "\n");
      return 128 + forwarded_signal_;
    }
    return 0;
  }

  const LaunchOptions& options_;
  const pid_t launcher_pid_ = ::getpid();
  int port_ = 0;
  int attempt_ = 0;
  int64_t started_at_s_ = 0;
  std::string recorder_dir_;
  bool own_recorder_dir_ = false;
  std::unique_ptr<JobStore> store_;
  Clock::time_point next_store_poll_{};
  std::vector<Rank> ranks_;
  std::optional<std::string> failure_;
  bool stopping_ = false;
  bool killed_ = false;
  int forwarded_signal_ = 0;
  std::optional<Clock::time_point> stop_deadline_;
};

}  // namespace

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
}

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

std::string omp_places_for(const std::vector<int>& cpus, int local_rank, int ranks, int threads) {
  if (threads < 1 || static_cast<size_t>(ranks) * static_cast<size_t>(threads) > cpus.size()) return "";
  std::string places;
  for (int t = 0; t < threads; ++t) {
    if (!places.empty()) places += ",";
    places += "{" + std::to_string(cpus[static_cast<size_t>(local_rank * threads + t)]) + "}";
  }
  return places;
}

void validate(const LaunchOptions& o) {
  FSDP_CHECK(!o.command.empty(), "fsdp launch: no command given: expected `fsdp launch -n N -- COMMAND [ARGS...]`");
  FSDP_CHECK(o.nproc_per_node >= 1, "fsdp launch: -n ", o.nproc_per_node, ": expected at least 1 rank");
  FSDP_CHECK(o.nnodes >= 1, "fsdp launch: --nnodes ", o.nnodes, ": expected at least 1");
  FSDP_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "fsdp launch: --node-rank ", o.node_rank,
             " is not below --nnodes ", o.nnodes);
  FSDP_CHECK(o.master_port >= 0 && o.master_port <= 65535, "fsdp launch: --master-port ", o.master_port,
             ": expected 1..65535 (or 0 for a free port)");
  FSDP_CHECK(o.nnodes == 1 || o.master_port > 0,
             "fsdp launch: --nnodes ", o.nnodes, " needs --master-port: every node must use the same port");
  FSDP_CHECK(o.max_restarts >= 0, "fsdp launch: --max-restarts ", o.max_restarts, ": expected 0 or more");
  FSDP_CHECK(o.stop_grace_s >= 0, "fsdp launch: --stop-grace ", o.stop_grace_s, ": expected seconds >= 0");
}

int run(const LaunchOptions& options) {
  validate(options);
  Supervisor supervisor(options);
  return supervisor.run();
}

}  // namespace fsdp::launch
