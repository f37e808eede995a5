#pragma once
// Gradient-norm clipping over sharded gradients: the norm is that of the
// whole model's gradient, computed from every rank's shards, and every rank
// gets the same value.

namespace torch::nn {
class Module;
}

namespace fsdp {

// Scales every gradient of `root` so their global norm is at most
// `max_norm` (no scaling when max_norm <= 0); returns the norm before
// clipping. `norm_type` 2 (L2) or infinity (the largest magnitude, as
// torch.nn.utils.clip_grad_norm_'s norm_type=inf). Collective over the
// units' shard groups: every rank calls it.
double clip_grad_norm_(torch::nn::Module& root, double max_norm, double norm_type = 2.0);

// The two halves of clip_grad_norm_, for an optimizer that applies the
// factor as it reads the gradients (optim::FusedAdamW::step_scaled):
// the global norm (collective, as above), and the factor the gradients
// are scaled by, max_norm / (norm + 1e-6) when 0 < max_norm < norm, else 1.
double grad_norm(torch::nn::Module& root, double norm_type = 2.0);
double clip_factor(double norm, double max_norm);
// Multiplies every gradient of `root` by `factor` in place.
void scale_gradients(torch::nn::Module& root, double factor);

}  // namespace fsdp
