#include "checkpoint/contents.h"

#include <set>
#include <unordered_map>

#include "fsdp/checkpoint/optimizer_state.h"
#include "fsdp/common/error.h"
#include "fsdp/core/replicate.h"

namespace fsdp::checkpoint::detail {

Contents contents_of(const Parts& parts, int world_size) {
  Contents c;
  FSDP_CHECK(!parts.models.empty(), "checkpoint: the parts name no model");
  std::unordered_map<const void*, size_t> index;  // parameter -> shard
  std::set<std::string> names;
  for (const auto& [name, module] : parts.models) {
    const std::string prefix = name.empty() ? "" : name + ".";
    for (auto& s : local_shards(*module)) {
      if (parts.frozen_left_out && !s.param.requires_grad()) continue;
      s.fqn = prefix + s.fqn;
      FSDP_CHECK(names.insert(s.fqn).second, "checkpoint: two model parts hold a parameter named '", s.fqn,
                 "'; give the models distinct names");
      index[s.param.unsafeGetTensorImpl()] = c.shards.size();
      c.shards.push_back(std::move(s));
    }
    for (const auto& item : module->named_buffers(/*recurse=*/true)) {
      if (!item.value().defined()) continue;
      const std::string fqn = prefix + item.key();
      FSDP_CHECK(names.insert(fqn).second, "checkpoint: two model parts hold a tensor named '", fqn,
                 "'; give the models distinct names");
      c.buffers.emplace_back(fqn, item.value());
    }
  }
  std::set<std::string> optimizer_names;
  for (const auto& [name, optimizer] : parts.optimizers) {
    FSDP_CHECK(!name.empty() && name.find('/') == std::string::npos && optimizer_names.insert(name).second,
               "checkpoint: optimizer part '", name, "' needs a name of its own, without '/'");
    Contents::Optimizer o{name, optimizer, optimizer_kind(*optimizer), {}};
    for (const auto& group : optimizer->param_groups()) {
      auto& indices = o.groups.emplace_back();
      for (const auto& p : group.params()) {
        const auto it = index.find(p.unsafeGetTensorImpl());
        FSDP_CHECK(it != index.end(), "checkpoint: optimizer '", name, "' steps a parameter of shape ", p.sizes(),
                   " that none of the model parts holds (create the optimizer after fully_shard, over the "
                   "models' parameters)");
        indices.push_back(it->second);
      }
    }
    c.optimizers.push_back(std::move(o));
  }
  c.frozen_left_out = parts.frozen_left_out;
  c.sharding = sharding_of(*parts.models.front().second);
  if (c.sharding.strategy.empty()) {
    c.sharding = {is_replicated(*parts.models.front().second) ? "replicate" : "unsharded", {world_size, 1}};
  }
  return c;
}

std::string optimizer_tensor_name(const std::string& optimizer, const std::string& tensor, const std::string& fqn) {
  return "optimizer/" + optimizer + "/" + tensor + "/" + fqn;
}

std::map<std::string, SavedOptimizer> saved_optimizers(const nlohmann::json& meta) {
  std::map<std::string, SavedOptimizer> out;
  if (meta["version"].get<int>() < 3) {
    SavedOptimizer& adam = out["optimizer"];
    adam.kind = "adamw";
    adam.legacy = true;
    for (const auto& [fqn, p] : meta["params"].items()) {
      const int64_t step = p["adam_step"].get<int64_t>();
      if (step > 0) adam.state[fqn] = {step, {"exp_avg", "exp_avg_sq"}};
    }
    return out;
  }
  for (const auto& [name, o] : meta["optimizers"].items()) {  // version 3 holds it (parse_metadata)
    SavedOptimizer& saved = out[name];
    saved.kind = o["kind"].get<std::string>();
    saved.groups = &o["groups"];
    for (const auto& [fqn, s] : o["state"].items()) {
      saved.state[fqn] = {s["step"].get<int64_t>(), s["tensors"].get<std::vector<std::string>>()};
    }
  }
  return out;
}

}  // namespace fsdp::checkpoint::detail
