#include "fsdp/distributed/launch_env.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "fsdp/common/error.h"

namespace fsdp::dist {
namespace {

// The variable names one launcher uses for the four numbers.
struct RankVars {
  Launcher launcher;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

constexpr RankVars kTorchrunVars{Launcher::kTorchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                 "LOCAL_WORLD_SIZE"};
constexpr RankVars kOpenMpiVars{Launcher::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr RankVars kSlurmVars{Launcher::kSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                              "SLURM_NTASKS_PER_NODE"};

int required_int(const EnvMap& env, const char* name, const RankVars& vars) {
  const auto value = env_int(env, name);
  FSDP_CHECK(value.has_value(), vars.rank, " is set (", to_string(vars.launcher),
             " launch) but ", name, " is not: the launcher sets both");
  return static_cast<int>(*value);
}

// Slurm writes tasks per node as "4" or "4(x2)" or "4(x2),3"; the first count
// is this node's when the allocation is homogeneous, which is what we need.
std::optional<long> slurm_tasks_per_node(const EnvMap& env) {
  if (auto v = env_int(env, "SLURM_NTASKS_PER_NODE")) return v;
  const auto text = env_string(env, "SLURM_TASKS_PER_NODE");
  if (!text || !std::isdigit(static_cast<unsigned char>((*text)[0]))) return std::nullopt;
  return std::stol(*text);
}

LaunchEnv parse_ranks(const EnvMap& env, const RankVars& vars) {
  LaunchEnv out;
  out.launcher = vars.launcher;
  out.rank = required_int(env, vars.rank, vars);
  out.world_size = required_int(env, vars.world_size, vars);
  FSDP_CHECK(out.world_size >= 1, vars.world_size, "=0: expected at least 1 rank");
  FSDP_CHECK(out.rank < out.world_size, vars.rank, "=", out.rank, " is not below ", vars.world_size,
             "=", out.world_size, ": ranks run from 0 to ", out.world_size - 1);

  std::optional<long> local_world =
      vars.launcher == Launcher::kSlurm ? slurm_tasks_per_node(env) : env_int(env, vars.local_world_size);
  out.local_world_size = static_cast<int>(local_world.value_or(out.world_size));
  FSDP_CHECK(out.local_world_size >= 1 && out.local_world_size <= out.world_size, vars.local_world_size,
             "=", out.local_world_size, " is not between 1 and ", vars.world_size, "=", out.world_size);
  out.local_rank = static_cast<int>(env_int(env, vars.local_rank).value_or(out.rank % out.local_world_size));
  FSDP_CHECK(out.local_rank < out.local_world_size, vars.local_rank, "=", out.local_rank,
             " is not below the ", out.local_world_size, " ranks on this node");
  return out;
}

}  // namespace

const char* to_string(Launcher launcher) {
  switch (launcher) {
    case Launcher::kNone: return "single-process";
    case Launcher::kTorchrun: return "torchrun/fsdp launch";
    case Launcher::kOpenMpi: return "Open MPI";
    case Launcher::kSlurm: return "Slurm";
  }
  return "?";
}

LaunchEnv parse_launch_env(const EnvMap& env) {
  LaunchEnv out;
  if (env_string(env, "RANK") || env_string(env, "WORLD_SIZE")) {
    FSDP_CHECK(env_string(env, "RANK"), "WORLD_SIZE is set but RANK is not: the launcher sets both");
    out = parse_ranks(env, kTorchrunVars);
  } else if (env_string(env, "OMPI_COMM_WORLD_RANK")) {
    out = parse_ranks(env, kOpenMpiVars);
  } else if (env_string(env, "SLURM_PROCID")) {
    out = parse_ranks(env, kSlurmVars);
  }

  if (const auto addr = env_string(env, "MASTER_ADDR")) {
    out.master_addr = *addr;
  } else {
    // Ranks on other nodes cannot find rank 0 by guessing.
    FSDP_CHECK(!out.multi_node(), "MASTER_ADDR is not set but the job spans nodes (", out.world_size,
               " ranks, ", out.local_world_size,
               " per node): export MASTER_ADDR=<host of rank 0> on every node");
  }
  if (out.launcher == Launcher::kNone) out.master_port = 0;
  if (const auto port = env_int(env, "MASTER_PORT")) {
    FSDP_CHECK(*port >= 1 && *port <= 65535, "MASTER_PORT=", *port, " is not a TCP port: expected 1..65535");
    out.master_port = static_cast<int>(*port);
  }
  return out;
}

namespace {

bool port_is_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

int find_free_port() {
  // Below the kernel's ephemeral range: a port picked there cannot be taken,
  // between this check and rank 0's bind, by a socket the kernel numbers
  // itself (Gloo's connections, say), only by an explicit bind.
  int low = 32768, high = 60999;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  const int first = 20000, last = low - 1;
  if (last - first > 100) {
    std::mt19937 rng(static_cast<unsigned>(::getpid()) ^ static_cast<unsigned>(
                         std::chrono::steady_clock::now().time_since_epoch().count()));
    std::uniform_int_distribution<int> pick(first, last);
    for (int attempt = 0; attempt < 200; ++attempt) {
      const int port = pick(rng);
      if (port_is_free(port)) return port;
    }
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  FSDP_CHECK(fd >= 0, "cannot find a free TCP port: socket failed: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  FSDP_CHECK(ok, "cannot find a free TCP port: ", std::strerror(err));
  return ntohs(addr.sin_port);
}

}  // namespace fsdp::dist
