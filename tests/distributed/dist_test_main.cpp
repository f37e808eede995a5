#include <gtest/gtest.h>

#include "dist_test_world.h"
#include "fsdp/common/error_text.h"
#include "fsdp/common/runtime.h"

namespace fsdp::testing {
namespace {
std::shared_ptr<dist::World> g_world;
}

dist::World& test_world() { return *g_world; }
std::shared_ptr<dist::World> test_world_ptr() { return g_world; }

}  // namespace fsdp::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    const fsdp::EnvMap env = fsdp::current_env();
    fsdp::init_runtime();
    fsdp::testing::g_world =
        fsdp::dist::World::init(fsdp::dist::parse_launch_env(env), fsdp::dist::DistOptions::from_env(env));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", fsdp::error_text(e).c_str());
    return 1;
  }
  const int result = RUN_ALL_TESTS();
  // A rank whose test failed must fail the job even if the others passed.
  return result;
}
