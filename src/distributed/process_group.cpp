#include "fsdp/distributed/process_group.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef FSDP_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "fsdp/common/error.h"
#include "fsdp/common/error_text.h"
#include "fsdp/distributed/desync.h"
#include "fsdp/distributed/launch_env.h"
#include "distributed/shared_memory.h"

namespace fsdp::dist {
namespace {

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const LaunchEnv& env) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0') {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  // On one machine, loopback always works; resolving the host name may not.
  if (!env.multi_node() && is_loopback(env.master_addr)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// The ranks in [0, world) that have not set fsdp/rank/<r>, as "8-15, 17".
std::string missing_ranks(c10d::Store& store, int world) {
  std::string out;
  int run_start = -1;
  const auto close_run = [&](int end) {
    if (run_start < 0) return;
    out += (out.empty() ? "" : ", ") + std::to_string(run_start) +
           (end - 1 > run_start ? "-" + std::to_string(end - 1) : "");
    run_start = -1;
  };
  for (int r = 0; r < world; ++r) {
    const bool arrived = store.check({"fsdp/rank/" + std::to_string(r)});
    if (!arrived && run_start < 0) run_start = r;
    if (arrived) close_run(r);
  }
  close_run(world);
  return out;
}

// Every rank announces itself, then waits until all have. TCPStore alone
// would let rank 0 proceed and fail later, inside Gloo, with a bare
// "Socket Timeout"; counting arrivals lets the error say who is missing.
// Rank 0 says every 10 s who has arrived and who is awaited: a node not
// started yet is otherwise a silent wait of up to the whole timeout.
void wait_for_all_ranks(c10d::Store& store, const LaunchEnv& env, std::chrono::milliseconds timeout) {
  const std::string key = "fsdp/arrived";
  store.set("fsdp/rank/" + std::to_string(env.rank), std::vector<uint8_t>{1});
  store.add(key, 1);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  auto next_report = start + std::chrono::seconds(10);
  for (;;) {
    const int64_t arrived = store.add(key, 0);
    if (arrived >= env.world_size) return;
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) {
      throw Error("rendezvous at " + env.master_addr + ":" + std::to_string(env.master_port) + " timed out after " +
                  std::to_string(timeout.count() / 1000) + " s: " + std::to_string(arrived) + " of " +
                  std::to_string(env.world_size) + " ranks arrived (missing: ranks " +
                  missing_ranks(store, env.world_size) +
                  "); start every rank with the same MASTER_ADDR/MASTER_PORT, or raise FSDP_TIMEOUT");
    }
    if (env.rank == 0 && now >= next_report) {
      next_report = now + std::chrono::seconds(10);
      const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - start).count();
      std::fprintf(stderr,
                   "rendezvous at %s:%d: %lld of %d ranks arrived after %lld s; waiting for ranks %s (up to %lld s)\n",
                   env.master_addr.c_str(), env.master_port, static_cast<long long>(arrived), env.world_size,
                   static_cast<long long>(waited), missing_ranks(store, env.world_size).c_str(),
                   static_cast<long long>(timeout.count() / 1000));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The address this host uses to reach MASTER_ADDR: how peers name it in
// errors ("rank 1 at 10.0.0.2"). No packet is sent: connecting a UDP socket
// only picks the route.
std::string local_address_toward(const std::string& master_addr) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  std::string address;
  if (::getaddrinfo(master_addr.c_str(), "9", &hints, &found) == 0 && found != nullptr) {
    const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET_ADDRSTRLEN] = {};
      if (::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) address = text;
    }
    if (fd >= 0) ::close(fd);
    ::freeaddrinfo(found);
  }
  if (address.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    address = host;
  }
  return address;
}

// Under `fsdp launch --max-restarts`, the launcher serves the store (on
// MASTER_PORT) for the whole job and every rank is its client; each attempt
// works under its own prefix, so keys of a failed attempt never leak into
// the next.
std::optional<std::string> agent_store_prefix() {
  const char* agent = std::getenv(kAgentStoreVar);
  if (agent == nullptr || std::string(agent) != "1") return std::nullopt;
  const char* attempt = std::getenv(kRestartAttemptVar);
  return "attempt" + std::string(attempt != nullptr ? attempt : "0");
}

// [Note: a rendezvous that never answers]
// TCPStore's client connects within its timeout, then waits for the
// server's answer to a ping with none: a port that accepts connections and
// never answers (another service, a stopped rank 0, a firewall that
// completes handshakes) held a rank forever whatever --timeout said. The
// store is made on a thread of its own, and waited for with the timeout
// (plus the connect's own share); past it, the rank fails naming the
// address, and the thread, still blocked, ends with the process.
c10::intrusive_ptr<c10d::Store> connect_store(const LaunchEnv& env, const c10d::TCPStoreOptions& opts,
                                              std::chrono::milliseconds timeout, const std::string& where) {
  if (opts.isServer) return c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
  using Result = std::promise<c10::intrusive_ptr<c10d::Store>>;
  auto result = std::make_shared<Result>();
  auto made = result->get_future();
  std::thread([result, host = env.master_addr, opts] {
    try {
      result->set_value(c10::make_intrusive<c10d::TCPStore>(host, opts));
    } catch (...) {
      result->set_exception(std::current_exception());
    }
  }).detach();
  if (made.wait_for(timeout + std::chrono::seconds(5)) != std::future_status::ready) {
    throw Error("rendezvous: rank " + std::to_string(env.rank) + " connected to " + where +
                " but got no answer within " + std::to_string(timeout.count() / 1000) +
                " s: what listens there is not rank 0's store (another service, or a stopped rank 0); check "
                "MASTER_ADDR/MASTER_PORT");
  }
  return made.get();
}

c10::intrusive_ptr<c10d::Store> rendezvous(LaunchEnv env, std::chrono::milliseconds timeout) {
  const auto agent_prefix = agent_store_prefix();
  if (env.master_port == 0) {
    FSDP_ASSERT(env.world_size == 1);
    env.master_port = find_free_port();
  }
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(env.master_port);
  opts.isServer = env.rank == 0 && !agent_prefix;
  opts.numWorkers = static_cast<std::size_t>(env.world_size);
  opts.waitWorkers = false;  // wait_for_all_ranks does it, with a better message
  opts.timeout = timeout;
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    c10::intrusive_ptr<c10d::Store> store = connect_store(env, opts, timeout, where);
    if (agent_prefix) store = c10::make_intrusive<c10d::PrefixStore>(*agent_prefix, store);
    return store;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string msg = error_text(e);
    const std::string secs = std::to_string(timeout.count() / 1000) + " s";
    if (msg.find("Address already in use") != std::string::npos) {
      throw Error("rendezvous: rank 0 cannot listen on MASTER_PORT=" + std::to_string(env.master_port) +
                  ": the port is already in use; choose a free one (MASTER_PORT, or let `fsdp launch` pick)");
    }
    if (msg.find("Permission denied") != std::string::npos) {
      throw Error("rendezvous: rank 0 may not listen on MASTER_PORT=" + std::to_string(env.master_port) +
                  " (permission denied); use a port above 1023");
    }
    if (msg.find("waiting for clients") != std::string::npos) {
      throw Error("rendezvous at " + where + " timed out after " + secs + ": not every one of the " +
                  std::to_string(env.world_size) + " ranks arrived (" + msg +
                  "); start all ranks, or raise FSDP_TIMEOUT");
    }
    if (env.rank != 0 && (msg.find("timed out") != std::string::npos ||
                          msg.find("Timed out") != std::string::npos ||
                          msg.find("connect") != std::string::npos)) {
      throw Error("rendezvous: rank " + std::to_string(env.rank) + " could not reach rank 0 at " + where +
                  " within " + secs + "; check MASTER_ADDR/MASTER_PORT and that rank 0 is running (" + msg +
                  ")");
    }
    throw Error("rendezvous at " + where + " failed: " + msg);
  }
}

}  // namespace

const char* to_string(Backend backend) { return spelling_of(backend); }

Backend parse_backend(const std::string& name) {
  const auto backend = parse_spelling<Backend>(name);
  FSDP_CHECK(backend.has_value(), "unknown backend '", name, "': expected ", spellings_text<Backend>(/*quoted=*/true));
#ifndef FSDP_WITH_NCCL
  FSDP_CHECK(*backend != Backend::kNccl,
             "backend 'nccl' is not in this build (built against a CPU LibTorch): use 'gloo'");
#endif
  return *backend;
}

DeviceChoice parse_device_choice(const std::string& name) {
  const auto choice = parse_spelling<DeviceChoice>(name);
  FSDP_CHECK(choice.has_value(), "unknown device '", name, "': expected ", spellings_text<DeviceChoice>(/*quoted=*/true));
  return *choice;
}

c10::Device choose_device(DeviceChoice choice, const LaunchEnv& env) {
  if (choice == DeviceChoice::kCpu) return c10::Device(c10::DeviceType::CPU);
#ifdef FSDP_WITH_CUDA
  const int visible = static_cast<int>(c10::cuda::device_count());
  if (visible == 0) {
    FSDP_CHECK(choice != DeviceChoice::kCuda,
               "device 'cuda': no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver); use 'cpu'");
    return c10::Device(c10::DeviceType::CPU);
  }
  // One GPU per local rank, as torchrun lays them out.
  const auto index = static_cast<c10::DeviceIndex>(env.local_rank % visible);
  c10::cuda::set_device(index);
  return c10::Device(c10::DeviceType::CUDA, index);
#else
  FSDP_CHECK(choice != DeviceChoice::kCuda,
             "device 'cuda': this build has no CUDA (built against a CPU LibTorch); use 'cpu', or build with "
             "scripts/build_cuda.sh");
  return c10::Device(c10::DeviceType::CPU);
#endif
}

int ranks_sharing_device(const c10::Device& device, const LaunchEnv& env) {
  if (!device.is_cuda()) return 1;
#ifdef FSDP_WITH_CUDA
  const int visible = std::max(1, static_cast<int>(c10::cuda::device_count()));
  const int index = device.index() < 0 ? 0 : device.index();
  // choose_device gives local rank r device r % visible.
  return env.local_world_size / visible + (index < env.local_world_size % visible ? 1 : 0);
#else
  (void)env;
  return 1;
#endif
}

Backend backend_for(const c10::Device& device, std::optional<Backend> requested, int sharing) {
  // See [Note: many ranks on one GPU].
  if (!requested) return device.is_cuda() && sharing <= 1 ? Backend::kNccl : Backend::kGloo;
  FSDP_CHECK(*requested != Backend::kNccl || device.is_cuda(),
             "backend 'nccl' needs a CUDA device, and this rank computes on the CPU; use 'gloo', or device 'cuda'");
  FSDP_CHECK(*requested != Backend::kNccl || sharing <= 1, "backend 'nccl' takes one rank per GPU, and ",
             sharing, " ranks of this host share ", device.str(),
             " (NCCL refuses them: \"Duplicate GPU detected\"); leave the backend unset, or 'gloo', and their "
             "collectives go through host memory, or start at most one rank per GPU");
  return *requested;
}

DistOptions DistOptions::from_env(const EnvMap& env) {
  DistOptions options;
  if (const auto backend = env_string(env, "FSDP_BACKEND")) options.backend = parse_backend(*backend);
  if (const auto device = env_string(env, "FSDP_DEVICE")) options.device = parse_device_choice(*device);
  if (const auto text = env_string(env, "FSDP_TIMEOUT")) {
    const double seconds = std::atof(text->c_str());
    FSDP_CHECK(seconds > 0, "FSDP_TIMEOUT='", *text, "': expected a positive number of seconds");
    options.timeout = std::chrono::milliseconds(static_cast<long>(seconds * 1000));
  }
  if (const auto text = env_string(env, "FSDP_SHARED_MEMORY")) {
    FSDP_CHECK(*text == "0" || *text == "1", "FSDP_SHARED_MEMORY='", *text,
               "': expected 1 (CPU collectives between ranks on one host go through shared memory, the default) "
               "or 0 (they use Gloo's TCP)");
    options.shared_memory = *text == "1";
  }
  return options;
}

ProcessGroup::ProcessGroup(std::string name, Backend backend, std::vector<int> global_ranks, int rank,
                           std::chrono::milliseconds timeout, c10::intrusive_ptr<compat::C10dBackend> impl)
    : native_all_gather(backend == Backend::kNccl || compat::kGlooMayHaveFlatAllGather),
      native_reduce_scatter(backend == Backend::kNccl || compat::kGlooMayHaveFlatReduceScatter),
      name_(std::move(name)),
      backend_(backend),
      global_ranks_(std::move(global_ranks)),
      rank_(rank),
      timeout_(timeout),
      impl_(std::move(impl)) {}

const char* ProcessGroup::transport() const { return shared_memory ? "shared memory" : to_string(backend_); }

std::string ProcessGroup::describe() const {
  const std::string how = shared_memory ? "gloo, shared memory" : to_string(backend_);
  return "group '" + name_ + "' (" + how + ", rank " + std::to_string(rank_) + " of " + std::to_string(size()) + ")";
}

std::string ProcessGroup::describe_peers() const {
  std::string text;
  int listed = 0;
  for (size_t i = 0; i < global_ranks_.size(); ++i) {
    if (static_cast<int>(i) == rank_) continue;
    if (++listed > 8) {
      text += ", ...";
      break;
    }
    if (!text.empty()) text += ", ";
    text += "rank " + std::to_string(global_ranks_[i]);
    if (i < hosts.size() && !hosts[i].empty()) text += " at " + hosts[i];
  }
  return text.empty() ? "none" : text;
}

World::World(LaunchEnv env, DistOptions options, c10::Device device, Backend backend,
             c10::intrusive_ptr<c10d::Store> store)
    : env_(std::move(env)), options_(options), device_(device), backend_(backend), store_(std::move(store)) {}

std::shared_ptr<World> World::init(const LaunchEnv& env, const DistOptions& options) {
  // The one device decision, before anything connects: a bad choice fails
  // on every rank alike, with nothing half-started.
  const c10::Device device = choose_device(options.device, env);
  const int sharing = ranks_sharing_device(device, env);
  const Backend backend = backend_for(device, options.backend, sharing);
  if (sharing > 1 && env.local_rank == 0) {
    std::fprintf(stderr,
                 "fsdp: %d ranks share %s on this host; NCCL takes one rank per GPU, so collectives go through "
                 "host memory (%s)\n",
                 sharing, device.str().c_str(), options.shared_memory ? "shared memory" : "gloo over TCP");
  }
  auto store = rendezvous(env, options.timeout);
  try {
    const std::string address = local_address_toward(env.master_addr);
    store->set("fsdp/host/" + std::to_string(env.rank), std::vector<uint8_t>(address.begin(), address.end()));
    wait_for_all_ranks(*store, env, options.timeout);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("rendezvous at " + env.master_addr + ":" + std::to_string(env.master_port) +
                " failed: " + error_text(e) + "; rank 0 may have exited");
  }
  std::shared_ptr<World> world(new World(env, options, device, backend, std::move(store)));
  world->learn_hosts();
  std::vector<int> all(static_cast<size_t>(env.world_size));
  for (int r = 0; r < env.world_size; ++r) all[static_cast<size_t>(r)] = r;
  world->group_ = world->new_group("world", all);
  // A group of its own, so the checks never shift the sequence of the
  // collectives they check (see [Note: desync checks]).
  if (detail_checks_enabled()) set_desync_check_group(world->new_group("desync-check", all));
  return world;
}

void World::learn_hosts() {
  hosts_.resize(static_cast<size_t>(env_.world_size));
  for (int r = 0; r < env_.world_size; ++r) {
    const auto bytes = store_->get("fsdp/host/" + std::to_string(r));  // set before the rank arrived
    hosts_[static_cast<size_t>(r)] = std::string(bytes.begin(), bytes.end());
  }
}

std::shared_ptr<ProcessGroup> World::new_group(const std::string& name, std::vector<int> global_ranks,
                                               const std::string& role, std::optional<Backend> backend) {
  const Backend kind = backend.value_or(backend_);
  FSDP_ASSERT(std::is_sorted(global_ranks.begin(), global_ranks.end()));
  const auto me = std::find(global_ranks.begin(), global_ranks.end(), env_.rank);
  FSDP_ASSERT(me != global_ranks.end());
  const int rank = static_cast<int>(me - global_ranks.begin());
  const int size = static_cast<int>(global_ranks.size());
  // Members create their groups in the same order, so the count agrees.
  const int generation = groups_named_[name]++;
  auto store = c10::make_intrusive<c10d::PrefixStore>("fsdp/" + name + "#" + std::to_string(generation), store_);
  c10::intrusive_ptr<compat::C10dBackend> impl;
  try {
    if (kind == Backend::kGloo) {
      auto opts = c10d::ProcessGroupGloo::Options::create(options_.timeout);
      opts->devices.push_back(gloo_device(env_));
      impl = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
    } else {
#ifdef FSDP_WITH_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = options_.timeout;
      impl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
#endif
    }
  } catch (const std::exception& e) {
    throw Error("connecting " + name + " (" + std::to_string(size) + " ranks, " + to_string(kind) +
                ") failed: " + error_text(e) + "; a peer died or never arrived");
  }
  auto group = std::make_shared<ProcessGroup>(name, kind, global_ranks, rank, options_.timeout, std::move(impl));
  for (int r : global_ranks) group->hosts.push_back(hosts_[static_cast<size_t>(r)]);
  group->set_role(role);
  if (kind == Backend::kGloo && size > 1) {
    // Every member takes part, wanting it or not, so that all agree.
    std::string why;
    try {
      group->shared_memory = SharedMemoryTransport::connect(*store, rank, size, options_.shared_memory, &why);
    } catch (const std::exception& e) {
      throw Error("connecting " + name + " (" + std::to_string(size) + " ranks): " + error_text(e));
    }
    const bool one_host = std::all_of(group->hosts.begin(), group->hosts.end(),
                                      [&](const std::string& h) { return h == group->hosts.front(); });
    if (!group->shared_memory && one_host && rank == 0 && !why.empty() && options_.shared_memory) {
      std::fprintf(stderr, "fsdp: %s keeps Gloo's TCP path; shared memory is unavailable: %s\n",
                   group->describe().c_str(), why.c_str());
    }
  }
  return group;
}

}  // namespace fsdp::dist
