// `fsdp smoke`: the first thing to run on a new machine or cluster. Every
// rank reports who it is, the ranks check three collectives against values
// each computes on its own, and rank 0 measures all-reduce bandwidth.

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "commands.h"
#include "dist_flags.h"
#include "fsdp/bench/comm_bench.h"
#include "fsdp/common/error.h"
#include "fsdp/distributed/collectives.h"

namespace fsdp::cli {
namespace {

void check(bool ok, const std::string& what) {
  FSDP_CHECK(ok, "smoke: ", what, " returned a wrong result");
}

int run_smoke(const DistFlags& flags, int64_t megabytes) {
  const auto world = flags.init_world();
  auto& group = world->group();
  const int rank = world->rank();
  const int w = world->size();
  char host[256] = "?";
  ::gethostname(host, sizeof(host));
  std::printf("rank %d of %d (local %d of %d) on %s: %s backend, %d intra-op thread(s), launcher: %s\n", rank, w,
              world->env().local_rank, world->env().local_world_size, host, dist::to_string(group.backend()),
              at::get_num_threads(), dist::to_string(world->env().launcher));
  std::fflush(stdout);
  dist::barrier(group);

  // all_reduce: sum of (rank + 1) over ranks is w(w+1)/2.
  at::Tensor sum = at::full({1}, rank + 1.0, at::kFloat);
  dist::all_reduce(group, sum).wait();
  check(sum.item<float>() == w * (w + 1) / 2.0f, "all_reduce");

  // all_gather: every rank's id, in rank order.
  at::Tensor gathered = at::empty({w}, at::kFloat);
  dist::all_gather_into_tensor(group, gathered, at::full({1}, static_cast<float>(rank))).wait();
  check(gathered.equal(at::arange(w, at::kFloat)), "all_gather_into_tensor");

  // reduce_scatter: element i of every rank's input is i, so rank r gets r * w.
  at::Tensor shard = at::empty({1}, at::kFloat);
  dist::reduce_scatter_tensor(group, shard, at::arange(w, at::kFloat)).wait();
  check(shard.item<float>() == static_cast<float>(rank * w), "reduce_scatter_tensor");

  bench::CommBenchOptions bench_options;
  bench_options.ops = {"all_reduce"};
  bench_options.min_bytes = bench_options.max_bytes = megabytes << 20;
  const auto rows = bench::run_comm_bench(group, bench_options, nullptr);
  if (rank == 0) {
    std::printf("all_reduce of %d+...+%d = %.0f on every rank; all_gather and reduce_scatter checked\n", 1, w,
                sum.item<float>());
    const auto& row = rows.front();
    std::printf("all_reduce of %lld MiB over %d ranks: %.2f ms, algbw %.3f GB/s, busbw %.3f GB/s, %lld wrong\n",
                static_cast<long long>(megabytes), w, row.time_us / 1000, row.algbw_gbs, row.busbw_gbs,
                static_cast<long long>(row.wrong));
    std::printf("smoke: OK\n");
  }
  return 0;
}

}  // namespace

void add_smoke_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<DistFlags>();
  auto megabytes = std::make_shared<int64_t>(64);
  auto* cmd = app.add_subcommand("smoke", "check that the ranks can talk: identities, collectives, bandwidth");
  flags->add_to(*cmd);
  cmd->add_option("--mib", *megabytes, "all-reduce size for the bandwidth figure (default 64)")
      ->check(CLI::Range(1, 4096));
  cmd->callback([flags, megabytes, &exit_code] { exit_code = run_smoke(*flags, *megabytes); });
}

}  // namespace fsdp::cli
