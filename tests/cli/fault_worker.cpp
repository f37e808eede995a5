// A distributed program whose ranks misbehave on purpose, so tests can
// check what the others and the launcher report:
//   fault_worker ok             one all_reduce, then "all_reduce completed"
//   fault_worker hang           rank 1 never joins the all_reduce
//   fault_worker die            rank 1 exits (code 7) before the all_reduce
//   fault_worker stall          rank 1 waits on a group rank 0 never uses
//   fault_worker desync-groups  ranks issue on groups 'a' and 'b' in opposite orders
//   fault_worker desync-size    rank 1 all-reduces 1000 elements, the others 1024
//   fault_worker desync-order   rank 0: all_reduce, broadcast; rank 1 the reverse
//   fault_worker desync-skip    rank 1 skips an all_reduce
// Healthy ranks print "[rank N] error: ..." and exit 1, as fsdp's CLI does.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <ATen/ATen.h>

#include "fsdp/common/error_text.h"
#include "fsdp/common/runtime.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/distributed/desync.h"

namespace {

using fsdp::dist::all_reduce;
using fsdp::dist::barrier;
using fsdp::dist::broadcast;

void desync_groups(fsdp::dist::World& world) {
  std::vector<int> all;
  for (int r = 0; r < world.size(); ++r) all.push_back(r);
  auto a = world.new_group("a", all);
  auto b = world.new_group("b", all);
  at::Tensor x = at::ones({256}), y = at::ones({256});
  // Issued together, so each group pairs up whatever the order.
  fsdp::dist::Work first = all_reduce(world.rank() == 0 ? *a : *b, x);
  fsdp::dist::Work second = all_reduce(world.rank() == 0 ? *b : *a, y);
  first.wait();
  second.wait();
  fsdp::dist::any_rank_and_check_sync(world.group(), false, "at the end of the test step");
  std::printf("desync not reported\n");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  int rank = -1;
  try {
    fsdp::init_runtime();
    const fsdp::EnvMap env = fsdp::current_env();
    auto world = fsdp::dist::World::init(fsdp::dist::parse_launch_env(env), fsdp::dist::DistOptions::from_env(env));
    rank = world->rank();
    auto& group = world->group();
    if (rank == 1 && mode == "hang") std::this_thread::sleep_for(std::chrono::seconds(600));
    if (rank == 1 && mode == "die") ::_exit(7);
    std::shared_ptr<fsdp::dist::ProcessGroup> side;
    if (mode == "stall") side = world->new_group("side", {0, 1});
    at::Tensor t = at::ones({mode == "stall" ? 256 : 1024});
    all_reduce(group, t).wait();
    if (mode == "desync-groups") desync_groups(*world);
    if (mode == "stall") all_reduce(rank == 1 ? *side : group, t).wait();
    if (mode == "desync-size") all_reduce(group, rank == 1 ? at::ones({1000}) : t).wait();
    if (mode == "desync-order") {
      if (rank == 0) all_reduce(group, t).wait();
      broadcast(group, t, 0).wait();
      if (rank != 0) all_reduce(group, t).wait();
    }
    if (mode == "desync-skip") {
      if (rank != 1) all_reduce(group, t).wait();
      barrier(group);
    }
    std::printf("all_reduce completed\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] error: %s\n", rank, fsdp::error_text(e).c_str());
    return 1;
  }
}
