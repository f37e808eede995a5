#pragma once
// Memory accounting read from the tensors FSDP holds, for telemetry and
// tests: how much of the model, its gradients and its optimizer state this
// rank keeps, and the most gathered parameter memory it held at once.

#include <cstdint>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace fsdp {

struct MemoryStats {
  int64_t sharded_param_bytes = 0;    // fp32 master shards of every unit
  int64_t grad_bytes = 0;             // gradients held by the module's parameters
  int64_t optimizer_state_bytes = 0;  // tensors in the optimizer's per-parameter state
  int64_t gathered_bytes = 0;         // gathered parameter buffers held right now
  int64_t peak_gathered_bytes = 0;    // the most held at once since the last reset
};

// `optimizer` may be null. Parameters shared by several modules count once.
MemoryStats memory_stats(const torch::nn::Module& module, const torch::optim::Optimizer* optimizer = nullptr);

namespace memory {
// Gathered-buffer bookkeeping, process-wide (one model per process).
void on_gathered(int64_t delta_bytes);
int64_t gathered_bytes();
int64_t peak_gathered_bytes();
void reset_peak();
}  // namespace memory

}  // namespace fsdp
