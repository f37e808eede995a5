// --init-from loads Hugging Face weights straight into shards: the model is
// built deferred, and fully_shard reads one full parameter at a time from the
// memory-mapped file, keeping only this rank's slice.

#include <malloc.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../distributed/dist_test_world.h"
#include "fsdp/common/flat_buffer.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/models/llama/model.h"
#include "fsdp/models/parallelize.h"
#include "fsdp/models/hf/weights.h"
#include "fsdp/models/registry.h"

namespace fsdp::testing::hf_shard_init_test {
namespace {

// Heap plus fsdp's cache of large CPU blocks (see flat_buffer.h).
int64_t heap_in_use() {
  return static_cast<int64_t>(mallinfo2().uordblks + mallinfo2().hblkhd) + memory::large_cpu_bytes_in_use();
}

TEST(HfShardInit, ParametersComeFromTheFileOneAtATime) {
  auto& world = test_world();
  // Rank 0 writes a Hugging Face directory for a Llama with many equal
  // layers (22 MB in all, no parameter above 0.5 MB); the others wait.
  const std::string dir = std::filesystem::temp_directory_path().string() + "/fsdp-hf-shard-init-" +
                          std::to_string(world.size()) + "-" + std::getenv("MASTER_PORT");
  models::LlamaConfig config{512, 256, 512, 8, 4, 2, 64};
  if (world.rank() == 0) {
    torch::manual_seed(5);
    models::LlamaForCausalLMImpl reference(config);
    std::vector<std::pair<std::string, torch::Tensor>> params;
    for (const auto& item : reference.named_parameters()) params.emplace_back(item.key(), item.value().detach());
    models::save_hf_pretrained(reference, params, dir);
  }
  dist::barrier(world.group());

  const int64_t before = heap_in_use();
  int64_t peak = 0;
  auto model = models::build_from_hf_dir(dir, /*deferred=*/true);
  auto weights = std::make_shared<models::HfWeights>(dir);
  weights->validate(*model);
  models::ParallelizeOptions options;
  options.fsdp.mesh = std::make_shared<dist::DeviceMesh>(make_mesh(test_world_ptr(), ShardingStrategy::kFullShard));
  options.fsdp.param_init = [&](const std::string& fqn, at::Tensor& full) {
    weights->fill(fqn, full);
    peak = std::max(peak, heap_in_use() - before);
  };
  models::parallelize(*model, options);

  const int64_t full_bytes = 4 * models::llama_parameter_count(config);
  const int64_t largest = 4 * 512 * 256;
  const int64_t shards = sharded_param_bytes(*model);
  EXPECT_LE(peak, shards + largest + (2 << 20)) << "full model " << full_bytes << " bytes";
  std::printf("init peak %lld bytes: shards %lld + largest parameter %lld\n", static_cast<long long>(peak),
              static_cast<long long>(shards), static_cast<long long>(largest));
  if (world.size() > 1) {
    EXPECT_LT(peak, full_bytes * 3 / 4) << "a rank held most of the model";
  }

  io::SafetensorsFile file(dir + "/model.safetensors");
  for (const auto& [name, value] : full_parameters(*model)) EXPECT_TRUE(value.equal(file.view(name))) << name;
  dist::barrier(world.group());
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fsdp::testing::hf_shard_init_test
