#include "fsdp/plan/runtime_overhead.h"

#include <torch/torch.h>

#include "fsdp/common/allocation_log.h"
#include "fsdp/common/flat_buffer.h"
#include "fsdp/common/runtime.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/lm_loss.h"
#include "fsdp/train/telemetry.h"

namespace fsdp::plan {

int64_t measure_runtime_overhead(bool bf16) {
  init_runtime();  // as a training process starts: its allocator, glibc's settings, its threads
  memory::count_cpu_allocations();
  auto model = models::build_preset("gpt2-tiny");
  if (bf16) model->to(torch::kBFloat16);
  const auto tokens = torch::randint(0, model->vocab_size(), {2, 64}, torch::kLong);
  const auto loss = nn::lm_loss(model->forward(tokens), model->output_weight(), tokens);
  loss.backward();
  return train::rss_bytes() - memory::allocated_bytes();
}

}  // namespace fsdp::plan
