#include "checkpoint/snapshot.h"

#include <algorithm>
#include <exception>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "checkpoint/agreement.h"
#include "checkpoint/contents.h"
#include "fsdp/checkpoint/optimizer_state.h"
#include "fsdp/common/compat.h"
#include "fsdp/common/error.h"

namespace fsdp::checkpoint::detail {

namespace {

// A copy in host memory that the program's next steps do not change
// (async saves), or the tensor itself (a save that writes before it returns).
at::Tensor keep(const at::Tensor& t, bool copy) {
  if (!copy) return t;
  return t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
}

}  // namespace

std::shared_ptr<Snapshot> snapshot(const Parts& parts, const TrainerState& state, int rank, int world_size, bool copy) {
  const Contents c = contents_of(parts, world_size);
  auto snap = std::make_shared<Snapshot>();
  snap->state = state;
  snap->sharding = c.sharding;
  snap->frozen_left_out = c.frozen_left_out;
  std::vector<io::SafetensorsWriter::Spec>& specs = snap->specs;
  std::vector<at::Tensor>& tensors = snap->tensors;
  const auto columns = kShardColumns + kOptimizerColumns * static_cast<int64_t>(c.optimizers.size());
  at::Tensor table = at::zeros({static_cast<int64_t>(c.shards.size()), columns}, at::kLong);
  auto rows = table.accessor<int64_t, 2>();
  for (size_t i = 0; i < c.shards.size(); ++i) {
    const auto& s = c.shards[i];
    snap->params.push_back({s.fqn, s.shape, s.local.scalar_type()});
    const bool writes = (s.sharded ? s.replica == 0 : rank == 0) && s.numel > 0;
    rows[i][0] = s.begin;
    rows[i][1] = s.numel;
    rows[i][2] = writes ? 1 : 0;
    if (writes) {
      specs.push_back({"model/" + s.fqn, s.local.scalar_type(), {s.numel}});
      tensors.push_back(keep(s.local, copy));
    }
  }
  for (size_t k = 0; k < c.optimizers.size(); ++k) {
    const auto& o = c.optimizers[k];
    Snapshot::Optimizer& saved = snap->optimizers.emplace_back();
    saved.name = o.name;
    saved.kind = o.kind;
    saved.groups = o.groups;
    for (const auto& group : o.optimizer->param_groups())
      saved.options.push_back(group_options(o.kind, group.options()));
    const auto& names = optimizer_state_tensors(o.kind);
    auto& states = o.optimizer->state();
    for (const auto& group : o.groups) {
      for (size_t i : group) {
        const auto& s = c.shards[i];
        const auto it = states.find(compat::optimizer_state_key(s.param));
        if (it == states.end()) continue;
        const ParamState state = read_param_state(o.kind, *it->second);
        const int64_t col = kShardColumns + kOptimizerColumns * static_cast<int64_t>(k);
        rows[i][col] = 1;
        rows[i][col + 1] = state.step;
        for (const auto& [tensor, value] : state.tensors) {
          FSDP_CHECK(value.numel() == s.param.numel(), "checkpoint: optimizer '", o.name, "' holds '", tensor, "' of ",
                     value.numel(), " elements for parameter '", s.fqn, "' of ", s.param.numel(),
                     ": only state shaped like its parameter is saved");
          rows[i][col + 2] |= int64_t{1} << (std::find(names.begin(), names.end(), tensor) - names.begin());
          if (rows[i][2] == 0) continue;
          specs.push_back({optimizer_tensor_name(o.name, tensor, s.fqn), value.scalar_type(), {s.numel}});
          tensors.push_back(keep(value.reshape({-1}), copy));
        }
      }
    }
  }
  const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  specs.push_back({"rng/cpu", rng.scalar_type(), rng.sizes().vec()});
  tensors.push_back(rng);
  snap->table = table;
  // Rank 0 writes the buffers (its own values: [Note: buffers in a
  // checkpoint]) and the metadata, with the states' JSON.
  if (rank == 0) {
    for (const auto& [fqn, value] : c.buffers) snap->buffers.emplace_back(fqn, keep(value.contiguous(), copy));
    snap->states = nlohmann::json::object();
    for (const auto& [name, part] : parts.states) snap->states[name] = part->state_dict();
  }
  return snap;
}

std::shared_ptr<Snapshot> agreed_snapshot(const Parts& parts, const TrainerState& state, dist::World& world,
                                          bool copy) {
  std::shared_ptr<Snapshot> snap;
  std::exception_ptr error;
  try {
    snap = snapshot(parts, state, world.rank(), world.size(), copy);
  } catch (...) {
    error = std::current_exception();
  }
  const auto failed = ranks_that_failed(world.group(), error != nullptr);
  if (error) std::rethrow_exception(error);
  FSDP_CHECK(failed.empty(), "checkpoint: rank ", failed.empty() ? 0 : failed.front(),
             " could not take its part of the save (its error says why); nothing was written");
  return snap;
}

}  // namespace fsdp::checkpoint::detail
