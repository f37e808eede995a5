// A distributed program whose rank 1 misbehaves on purpose, so tests can
// check what the others report:
//   fault_worker hang   rank 1 never joins the all_reduce
//   fault_worker die    rank 1 exits before the all_reduce
// Healthy ranks print "[rank N] error: ..." and exit 1, as fsdp's CLI does.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <ATen/ATen.h>

#include "fsdp/common/error_text.h"
#include "fsdp/common/runtime.h"
#include "fsdp/dist/collectives.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  int rank = -1;
  try {
    fsdp::init_runtime();
    const fsdp::EnvMap env = fsdp::current_env();
    auto world = fsdp::dist::World::init(fsdp::dist::parse_launch_env(env), fsdp::dist::DistOptions::from_env(env));
    rank = world->rank();
    if (rank == 1 && mode == "hang") std::this_thread::sleep_for(std::chrono::seconds(600));
    if (rank == 1 && mode == "die") ::_exit(7);
    at::Tensor t = at::ones({1024});
    fsdp::dist::all_reduce(world->group(), t).wait();
    std::printf("all_reduce completed\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] error: %s\n", rank, fsdp::error_text(e).c_str());
    return 1;
  }
}
