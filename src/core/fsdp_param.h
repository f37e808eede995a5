#pragma once
// One original parameter under FSDP (FSDP2's FSDPParam). The registered
// parameter tensor keeps its identity for the whole run, so optimizers and
// parameter groups built from module->parameters() stay valid; what changes
// is the data it points at:
//   sharded:   a view of this rank's part of the unit's master shard: a 1-D
//              slice (possibly empty), or under a Shard(d) placement its chunk
//              in the parameter's shape: what the optimizer updates;
//   unsharded: a view, in the parameter's original shape and compute dtype,
//              of the unit's gathered flat buffer: what forward and backward use.
// See [Note: FSDP and autograd] in fsdp_param_group.cpp.

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdp/common/compat.h"

#include "fsdp/core/shard_layout.h"

namespace torch::autograd {
struct Node;
}

namespace fsdp {

struct FSDPParam {
  std::string fqn;                   // fully qualified name from the root
  at::Tensor param;                  // the registered parameter (identity kept)
  std::vector<int64_t> shape;        // unsharded shape
  int64_t numel = 0;
  int64_t offset = 0;                // first element in the unit's flat buffer
  ShardRange local;                  // this rank's part
  // Shard(d) placement: the dim it is chunked along (-1: the flat layout),
  // and the padded chunk every rank's shard reserves for it.
  int64_t shard_dim = -1;
  // Kept in its own dtype under a mixed-precision policy ([Note: modules
  // kept in full precision], full_precision.cpp).
  bool full_precision = false;
  std::vector<int64_t> chunk_shape;
  int64_t chunk_numel() const;
  // Rows of the chunk along shard_dim that rank `rank` holds (0 to chunk).
  int64_t rows_held(int rank) const;

  // Held so the post-accumulate hook lives as long as the node; the node is
  // re-created by autograd when the parameter's dtype changes (set_data).
  compat::AutogradNodePtr grad_accumulator;
  // The sharded gradient the optimizer saw last step, set aside while the
  // parameter is unsharded so autograd works on a full-shape gradient, and
  // the one-element stand-in the parameter holds as its gradient meanwhile,
  // which tells whether a zero_grad came in between ([Note: zero_grad
  // between forward and backward], gradient_paths.cpp).
  at::Tensor sharded_grad_stash;
  at::Tensor stash_marker;
  // Whether the parameter had a gradient before this backward: one that no
  // rank produced a gradient for is left as it was (undefined stays
  // undefined, so optimizers skip it, as in one process).
  bool grad_existed_before = false;
  bool grad_existence_recorded = false;

  bool requires_grad() const;
};

}  // namespace fsdp
