#include "fsdp/models/parallelize.h"

#include <map>
#include <set>

#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"

namespace fsdp::models {

namespace {

struct Unit {
  std::shared_ptr<torch::nn::Module> module;
  int64_t own_params = 0;  // those no unit below it holds
};

// Parameters of `m` not in `held`, and their element count.
std::pair<std::vector<const void*>, int64_t> own_parameters(torch::nn::Module& m, const std::set<const void*>& held) {
  std::pair<std::vector<const void*>, int64_t> out;
  for (const auto& p : m.parameters()) {
    if (held.count(p.unsafeGetTensorImpl()) != 0) continue;
    out.first.push_back(p.unsafeGetTensorImpl());
    out.second += p.numel();
  }
  return out;
}

// The units below the root, children first; `held` gets their parameters.
std::vector<Unit> choose_units(CausalLMImpl& model, const WrapPolicy& policy, std::set<const void*>& held) {
  const bool by_block = policy.kind == WrapPolicy::Kind::kBlock;
  std::vector<Unit> chosen;
  for (const auto& candidate : by_block ? model.blocks() : model.wrap_candidates()) {
    auto [ids, own] = own_parameters(*candidate, held);
    if (!by_block && own < policy.min_params) continue;
    chosen.push_back({candidate, own});
    held.insert(ids.begin(), ids.end());
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
  // Chosen and counted before sharding: afterwards a parameter is this rank's shard.
  std::set<const void*> held;
  const auto units = choose_units(model, options.wrap, held);
  const int64_t root_params = own_parameters(model, held).second;
  // fully_shard names a unit's parameters from the unit; param_init wants
  // names from the model ("transformer.h.3.attn.c_attn.weight").
  std::map<const torch::nn::Module*, std::string> prefix;
  for (const auto& item : model.named_modules()) prefix[item.value().get()] = item.key();
  std::vector<std::pair<std::string, int64_t>> made;
  for (const auto& unit : units) {
    FullyShardOptions unit_options = options.fsdp;
    if (options.fsdp.param_init) {
      unit_options.param_init = [init = options.fsdp.param_init, p = prefix.at(unit.module.get())](
                                    const std::string& name, at::Tensor& full) { init(p + "." + name, full); };
    }
    fully_shard(*unit.module, unit_options);
    made.emplace_back(prefix.at(unit.module.get()), unit.own_params);
  }
  FullyShardOptions root_options = options.fsdp;
  root_options.reshard_after_forward.reset();
  fully_shard(model, root_options);
  made.emplace_back("", root_params);
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
