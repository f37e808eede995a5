#pragma once
// Gradient-norm clipping over sharded gradients: the norm is that of the
// whole model's gradient, computed from every rank's shards, and every rank
// gets the same value.

namespace torch::nn {
class Module;
}

namespace fsdp {

// Scales every gradient of `root` so their global L2 norm is at most
// `max_norm` (no scaling when max_norm <= 0); returns the norm before
// clipping. Collective over the units' shard group: every rank calls it.
double clip_grad_norm_(torch::nn::Module& root, double max_norm);

}  // namespace fsdp
