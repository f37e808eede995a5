#pragma once
// Memory accounting read from the tensors FSDP holds, for telemetry and
// tests: how much of the model, its gradients and its optimizer state this
// rank keeps, and the transient buffers a step allocates (gathered
// parameters, unsharded gradients, communication buffers), now and at most.

#include <cstdint>

#include "fsdp/common/buffer_accounting.h"
#include "fsdp/common/flat_buffer.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace fsdp {

struct MemoryStats {
  int64_t sharded_param_bytes = 0;    // master shards of every unit, in the module's dtype
  int64_t grad_bytes = 0;             // gradients held by the module's parameters
  int64_t optimizer_state_bytes = 0;  // tensors in the optimizer's per-parameter state
  // Of the three above, what lives on the host (CPU offload of units, an
  // optimizer's offloaded state: memory::is_host_buffer); the rest is the
  // compute device's.
  int64_t host_param_bytes = 0;
  int64_t host_grad_bytes = 0;
  int64_t host_optimizer_state_bytes = 0;
  int64_t gathered_bytes = 0;         // gathered parameter buffers held right now
  int64_t peak_gathered_bytes = 0;    // the most held at once since the last reset
  int64_t unsharded_grad_bytes = 0;   // gradient buffers of gathered units (backward, no-sync accumulation)
  int64_t peak_unsharded_grad_bytes = 0;
  int64_t comm_bytes = 0;             // communication buffers: collective inputs, receive buffers, reduced shards
  int64_t peak_comm_bytes = 0;
  int64_t transient_bytes = 0;        // gathered + unsharded gradients + communication, now
  int64_t peak_transient_bytes = 0;   // ... and the most held at once
};

// `optimizer` may be null. Parameters shared by several modules count once.
MemoryStats memory_stats(const torch::nn::Module& module, const torch::optim::Optimizer* optimizer = nullptr);

namespace memory {
int64_t gathered_bytes();
int64_t peak_gathered_bytes();
// Every peak restarts from what is held now.
void reset_peak();
}  // namespace memory

}  // namespace fsdp
