#include "fsdp/plan/runtime_overhead.h"

#include <fstream>
#include <string>

#include <torch/torch.h>

#include "fsdp/common/allocation_log.h"
#include "fsdp/common/flat_buffer.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/lm_loss.h"

namespace fsdp::plan {
namespace {

int64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace

int64_t measure_runtime_overhead(bool bf16) {
  memory::count_cpu_allocations();
  auto model = models::build_preset("gpt2-tiny");
  if (bf16) model->to(torch::kBFloat16);
  const auto tokens = torch::randint(0, model->vocab_size(), {2, 64}, torch::kLong);
  const auto loss = nn::lm_loss(model->forward(tokens), model->output_weight(), tokens);
  loss.backward();
  return resident_bytes() - memory::allocated_bytes();
}

}  // namespace fsdp::plan
