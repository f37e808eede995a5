#include "fsdp/checkpoint/state_dict.h"

#include <map>
#include <set>

#include "fsdp/common/error.h"
#include "fsdp/common/error_text.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/dist/collectives.h"
#include "fsdp/io/safetensors.h"

namespace fsdp::checkpoint {

std::vector<std::pair<std::string, at::Tensor>> full_state_dict(torch::nn::Module& root) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, value] : full_parameters(root)) out.emplace_back(name, value.detach().to(at::kCPU).contiguous());
  for (const auto& item : root.named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) out.emplace_back(item.key(), item.value().detach().to(at::kCPU).contiguous());
  }
  return out;
}

void save_full_state_dict(torch::nn::Module& root, const std::string& path, dist::World& world) {
  const auto tensors = full_state_dict(root);
  std::string error;
  if (world.rank() == 0) {
    try {
      std::vector<io::SafetensorsWriter::Spec> specs;
      for (const auto& [name, t] : tensors) specs.push_back({name, t.scalar_type(), t.sizes().vec()});
      io::SafetensorsWriter writer(path, specs);
      for (const auto& [name, t] : tensors) writer.write(t);
      writer.commit();
    } catch (const std::exception& e) {
      error = error_text(e);
    }
  }
  // Every rank learns whether rank 0 wrote it.
  at::Tensor failed = at::full({1}, error.empty() ? 0 : 1, at::kInt);
  dist::broadcast(world.group(), failed, 0).wait();
  FSDP_CHECK(failed.item<int>() == 0, "saving the full state dict to '", path, "' failed on rank 0",
             error.empty() ? std::string() : ": " + error);
}

void load_full_state_dict(torch::nn::Module& root, const std::string& path) {
  const io::SafetensorsFile file(path);
  const auto shards = local_shards(root);
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  for (const auto& item : root.named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) buffers.emplace_back(item.key(), item.value());
  }
  // Every check before any write: a refused file changes nothing.
  std::set<std::string> expected;
  const auto check = [&](const std::string& name, const std::vector<int64_t>& shape) {
    expected.insert(name);
    const auto* entry = file.find(name);
    FSDP_CHECK(entry != nullptr, "state dict '", path, "' has no '", name, "', which the module has (shape ",
               c10::IntArrayRef(shape), ")");
    FSDP_CHECK(entry->shape == shape, "state dict '", path, "': '", name, "' has shape ",
               c10::IntArrayRef(entry->shape), ", the module's is ", c10::IntArrayRef(shape));
  };
  for (const auto& s : shards) check(s.fqn, s.shape);
  for (const auto& [name, value] : buffers) check(name, value.sizes().vec());
  for (const auto& e : file.entries()) {
    FSDP_CHECK(expected.count(e.name) != 0, "state dict '", path, "' holds '", e.name, "' (shape ",
               c10::IntArrayRef(e.shape), "), which the module does not have");
  }
  at::NoGradGuard no_grad;
  for (const auto& s : shards) {
    if (s.numel > 0) s.local.copy_(file.read_range(s.fqn, s.begin, s.numel));
  }
  for (const auto& [name, value] : buffers) value.detach().copy_(file.view(name));
}

}  // namespace fsdp::checkpoint
