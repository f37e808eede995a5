#include "fsdp/plan/model_shape.h"

#include <set>

#include "fsdp/common/error.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/layers.h"
#include "fsdp/nn/lora.h"

namespace fsdp::plan {

namespace {

int64_t count_trainable(const torch::nn::Module& module) {
  int64_t n = 0;
  std::set<const void*> seen;  // a tied weight once
  for (const auto& p : module.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second && p.requires_grad()) n += p.numel();
  }
  return n;
}

}  // namespace

ModelShape model_shape(const train::TrainConfig& job) {
  const auto& config = job.model;
  models::CausalLM model;
  {
    nn::DeferredInit deferred;  // shapes only: no parameter gets memory
    model = config.init_from.empty() ? models::build_preset(config.name, 0.0, config.vocab_size)
                                     : models::build_from_hf_dir(config.init_from, /*deferred=*/true);
    if (job.lora.rank > 0) {
      nn::LoraOptions o;
      o.rank = job.lora.rank;
      o.alpha = job.lora.alpha;
      o.targets = job.lora_targets();
      nn::add_lora(*model, o);
    }
  }
  const std::string what = config.init_from.empty() ? "--model " + config.name : "--init-from " + config.init_from;
  const auto& family = models::family_of(*model);
  if (!family.shape) throw Error(what + ": fsdp plan has no memory formula for the " + family.name + " family");
  ModelShape s = family.shape(*model);
  const auto blocks = model->blocks();
  FSDP_CHECK(!blocks.empty(), what, ": the model has no blocks");
  FSDP_CHECK(static_cast<int64_t>(blocks.size()) == s.layers, what, ": ", blocks.size(), " blocks for ", s.layers,
             " layers");
  int64_t in_blocks = 0;
  int64_t trainable_in_blocks = 0;
  for (const auto& b : blocks) {
    s.block_params.push_back(models::count_parameters(*b));
    in_blocks += s.block_params.back();
    s.block_trainable.push_back(count_trainable(*b));
    trainable_in_blocks += s.block_trainable.back();
  }
  s.root_params = models::count_parameters(*model) - in_blocks;
  s.root_trainable = count_trainable(*model) - trainable_in_blocks;
  return s;
}

}  // namespace fsdp::plan
