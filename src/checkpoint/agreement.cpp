#include "checkpoint/agreement.h"

#include <ATen/ATen.h>

#include "fsdp/distributed/collectives.h"

namespace fsdp::checkpoint::detail {

std::vector<int> ranks_that_failed(dist::ProcessGroup& group, bool failed_here) {
  at::Tensor failed = at::zeros({group.size()}, at::kInt);
  failed[group.rank()] = failed_here ? 1 : 0;
  dist::all_reduce(group, failed).wait();
  std::vector<int> ranks;
  for (int r = 0; r < group.size(); ++r) {
    if (failed[r].item<int>() != 0) ranks.push_back(r);
  }
  return ranks;
}

}  // namespace fsdp::checkpoint::detail
