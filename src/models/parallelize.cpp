#include "fsdp/models/parallelize.h"

#include <map>
#include <set>

#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"

namespace fsdp::models {

namespace {

// The modules that become units before the root, children first.
std::vector<std::shared_ptr<torch::nn::Module>> choose_units(CausalLMImpl& model, const WrapPolicy& policy) {
  if (policy.kind == WrapPolicy::Kind::kBlock) return model.blocks();
  // size:N: a candidate's own parameters are those no chosen unit below it holds.
  std::vector<std::shared_ptr<torch::nn::Module>> chosen;
  std::set<const void*> held;
  for (const auto& candidate : model.wrap_candidates()) {
    int64_t own = 0;
    std::vector<const void*> mine;
    for (const auto& p : candidate->parameters()) {
      if (held.count(p.unsafeGetTensorImpl()) != 0) continue;
      own += p.numel();
      mine.push_back(p.unsafeGetTensorImpl());
    }
    if (own < policy.min_params) continue;
    chosen.push_back(candidate);
    held.insert(mine.begin(), mine.end());
  }
  return chosen;
}

}  // namespace

std::vector<std::pair<std::string, int64_t>> parallelize(CausalLMImpl& model, const ParallelizeOptions& options) {
  const bool by_block = options.wrap.kind == WrapPolicy::Kind::kBlock;
  FSDP_CHECK(by_block || !options.activation_checkpoint,
             "activation checkpointing needs --wrap-policy block (it recomputes whole blocks)");
  FSDP_CHECK(by_block || !options.explicit_prefetch,
             "--explicit-prefetch needs --wrap-policy block (each block prefetches its neighbour)");
  model.set_activation_checkpointing(options.activation_checkpoint);
  const auto units = choose_units(model, options.wrap);
  // fully_shard names a unit's parameters from the unit; param_init wants
  // names from the model ("transformer.h.3.attn.c_attn.weight").
  std::map<const torch::nn::Module*, std::string> prefix;
  for (const auto& item : model.named_modules()) prefix[item.value().get()] = item.key();
  std::vector<std::pair<std::string, int64_t>> made;
  std::set<const void*> held;
  const auto count_new = [&](torch::nn::Module& m) {
    int64_t n = 0;
    for (const auto& p : m.parameters()) {
      if (held.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
    }
    return n;
  };
  for (const auto& unit : units) {
    FullyShardOptions unit_options = options.fsdp;
    if (options.fsdp.param_init) {
      unit_options.param_init = [init = options.fsdp.param_init, p = prefix.at(unit.get())](
                                    const std::string& name, at::Tensor& full) { init(p + "." + name, full); };
    }
    // Counted before sharding: afterwards a parameter is this rank's shard.
    made.emplace_back(prefix.at(unit.get()), count_new(*unit));
    fully_shard(*unit, unit_options);
  }
  made.emplace_back("", count_new(model));
  fully_shard(model, options.fsdp);
  if (options.explicit_prefetch) {
    // The example trainer's --explicit-prefetch: block i gathers block i+1
    // in forward and block i-1 in backward.
    const auto blocks = model.blocks();
    for (size_t i = 0; i + 1 < blocks.size(); ++i) set_modules_to_forward_prefetch(*blocks[i], {blocks[i + 1].get()});
    for (size_t i = 1; i < blocks.size(); ++i) set_modules_to_backward_prefetch(*blocks[i], {blocks[i - 1].get()});
  }
  return made;
}

}  // namespace fsdp::models
