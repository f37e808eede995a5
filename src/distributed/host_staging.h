#pragma once
// Device tensors through a host transport: ranks that share a GPU cannot use
// NCCL, so their collectives run on host memory (the shared-memory transport
// or Gloo) and each device tensor is copied there and back. See [Note: many
// ranks on one GPU] in host_staging.cpp.

#include <ATen/core/Tensor.h>

namespace fsdp::dist {

// A host tensor of `t`'s shape and dtype (pinned where `t` is on a device),
// holding `t`'s values when `with_values`. Returns once the values are on
// the host: the copy runs on a side stream ordered after the compute issued
// so far.
at::Tensor stage_to_host(const at::Tensor& t, bool with_values);

// device <- host, on the side stream; the current stream waits for the
// copy before any later work reads `device`.
void unstage_from_host(const at::Tensor& device, const at::Tensor& host);

}  // namespace fsdp::dist
