#include "fsdp/checkpoint/optimizer_state.h"

#include <functional>
#include <map>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "fsdp/checkpoint/parts.h"
#include "fsdp/common/error.h"

namespace fsdp::checkpoint {
namespace {

using json = nlohmann::json;

// One kind's state and options, described once: its tensors (name, getter,
// setter); its hyperparameters (name, to JSON,
// from JSON). Everything else in this file works from these tables.
template <typename State, typename Options>
struct Kind {
  struct Tensor {
    std::string name;
    std::function<at::Tensor(const State&)> get;
    std::function<void(State&, const at::Tensor&)> set;
  };
  struct Option {
    std::string name;
    std::function<json(const Options&)> get;
    std::function<void(Options&, const json&)> set;  // throws json's type_error for the wrong type
  };
  std::vector<Tensor> tensors;
  std::vector<Option> options;
};

#define FSDP_STATE_TENSOR(name) \
  { #name, [](const State& s) { return s.name(); }, [](State& s, const at::Tensor& t) { s.name(t); } }
#define FSDP_OPTION(name) \
  { #name, [](const Options& o) { return json(o.name()); }, [](Options& o, const json& v) { o.name(v.get<std::decay_t<decltype(o.name())>>()); } }
#define FSDP_BETAS                                                                                     \
  {                                                                                                    \
    "betas", [](const Options& o) { return json::array({std::get<0>(o.betas()), std::get<1>(o.betas())}); }, \
        [](Options& o, const json& v) {                                                                \
          if (!v.is_array() || v.size() != 2) throw std::invalid_argument("betas"); \
          o.betas(std::make_tuple(v[0].get<double>(), v[1].get<double>()));                            \
        }                                                                                              \
  }

template <typename State, typename Options>
using KindOf = Kind<State, Options>;

// SGD's state counts no steps (it has no step() to call).
template <typename State, typename = void>
struct CountsSteps : std::false_type {};
template <typename State>
struct CountsSteps<State, std::void_t<decltype(std::declval<State&>().step())>> : std::true_type {};

const auto& sgd() {
  using State = torch::optim::SGDParamState;
  using Options = torch::optim::SGDOptions;
  static const KindOf<State, Options> kind{{FSDP_STATE_TENSOR(momentum_buffer)},
                                           {FSDP_OPTION(lr), FSDP_OPTION(momentum), FSDP_OPTION(dampening),
                                            FSDP_OPTION(weight_decay), FSDP_OPTION(nesterov)}};
  return kind;
}

template <typename State, typename Options>
const KindOf<State, Options>& adam_like() {
  static const KindOf<State, Options> kind{
      {FSDP_STATE_TENSOR(exp_avg), FSDP_STATE_TENSOR(exp_avg_sq), FSDP_STATE_TENSOR(max_exp_avg_sq)},
      {FSDP_OPTION(lr), FSDP_BETAS, FSDP_OPTION(eps), FSDP_OPTION(weight_decay), FSDP_OPTION(amsgrad)}};
  return kind;
}

const auto& rmsprop() {
  using State = torch::optim::RMSpropParamState;
  using Options = torch::optim::RMSpropOptions;
  static const KindOf<State, Options> kind{
      {FSDP_STATE_TENSOR(square_avg), FSDP_STATE_TENSOR(momentum_buffer), FSDP_STATE_TENSOR(grad_avg)},
      {FSDP_OPTION(lr), FSDP_OPTION(alpha), FSDP_OPTION(eps), FSDP_OPTION(weight_decay), FSDP_OPTION(momentum),
       FSDP_OPTION(centered)}};
  return kind;
}

const auto& adagrad() {
  using State = torch::optim::AdagradParamState;
  using Options = torch::optim::AdagradOptions;
  static const KindOf<State, Options> kind{{FSDP_STATE_TENSOR(sum)},
                                           {FSDP_OPTION(lr), FSDP_OPTION(lr_decay), FSDP_OPTION(weight_decay),
                                            FSDP_OPTION(initial_accumulator_value), FSDP_OPTION(eps)}};
  return kind;
}

#undef FSDP_STATE_TENSOR
#undef FSDP_OPTION
#undef FSDP_BETAS

// Calls fn(table, state type tag, options type tag) for `kind`.
template <typename Fn>
decltype(auto) with_kind(const std::string& kind, Fn&& fn) {
  using namespace torch::optim;
  if (kind == "sgd") return fn(sgd());
  if (kind == "adam") return fn(adam_like<AdamParamState, AdamOptions>());
  if (kind == "adamw") return fn(adam_like<AdamWParamState, AdamWOptions>());
  if (kind == "rmsprop") return fn(rmsprop());
  if (kind == "adagrad") return fn(adagrad());
  throw Error("optimizer kind '" + kind + "' is not one a checkpoint holds (sgd, adam, adamw, rmsprop, adagrad)");
}

template <typename K>
struct Types;
template <typename State, typename Options>
struct Types<Kind<State, Options>> {
  using StateType = State;
  using OptionsType = Options;
};

template <typename Table>
using StateOf = typename Types<std::decay_t<Table>>::StateType;
template <typename Table>
using OptionsOf = typename Types<std::decay_t<Table>>::OptionsType;

}  // namespace

std::string optimizer_kind(const torch::optim::Optimizer& optimizer) {
  using namespace torch::optim;
  if (dynamic_cast<const SGD*>(&optimizer) != nullptr) return "sgd";
  if (dynamic_cast<const AdamW*>(&optimizer) != nullptr) return "adamw";
  if (dynamic_cast<const Adam*>(&optimizer) != nullptr) return "adam";
  if (dynamic_cast<const RMSprop*>(&optimizer) != nullptr) return "rmsprop";
  if (dynamic_cast<const Adagrad*>(&optimizer) != nullptr) return "adagrad";
  throw Error(std::string("a checkpoint holds the state of SGD, Adam, AdamW (fsdp::optim::FusedAdamW too), RMSprop "
                          "and Adagrad, whose state is per parameter; this optimizer is a ") +
              typeid(optimizer).name() + " (LBFGS's state is not per parameter; a class of your own: save its "
              "state through a checkpoint::Stateful part)");
}

const std::vector<std::string>& optimizer_state_tensors(const std::string& kind) {
  static const std::map<std::string, std::vector<std::string>> names = [] {
    std::map<std::string, std::vector<std::string>> out;
    for (const char* k : {"sgd", "adam", "adamw", "rmsprop", "adagrad"}) {
      with_kind(k, [&](const auto& table) {
        for (const auto& t : table.tensors) out[k].push_back(t.name);
        return 0;
      });
    }
    return out;
  }();
  const auto it = names.find(kind);
  FSDP_CHECK(it != names.end(), "optimizer kind '", kind, "' is not one a checkpoint holds");
  return it->second;
}

ParamState read_param_state(const std::string& kind, const torch::optim::OptimizerParamState& state) {
  return with_kind(kind, [&](const auto& table) {
    const auto& typed = static_cast<const StateOf<decltype(table)>&>(state);
    ParamState out;
    if constexpr (CountsSteps<StateOf<decltype(table)>>::value) out.step = typed.step();
    for (const auto& t : table.tensors) {
      at::Tensor value = t.get(typed);
      if (value.defined()) out.tensors.emplace_back(t.name, value);
    }
    return out;
  });
}

std::unique_ptr<torch::optim::OptimizerParamState> make_param_state(const std::string& kind, const ParamState& state) {
  return with_kind(kind, [&](const auto& table) -> std::unique_ptr<torch::optim::OptimizerParamState> {
    auto typed = std::make_unique<StateOf<decltype(table)>>();
    if constexpr (CountsSteps<StateOf<decltype(table)>>::value) typed->step(state.step);
    for (const auto& [name, value] : state.tensors) {
      bool known = false;
      for (const auto& t : table.tensors) {
        if (t.name != name) continue;
        t.set(*typed, value);
        known = true;
      }
      FSDP_CHECK(known, "optimizer state '", name, "' is not one ", kind, " holds");
    }
    return typed;
  });
}

json group_options(const std::string& kind, const torch::optim::OptimizerOptions& options) {
  return with_kind(kind, [&](const auto& table) {
    const auto& typed = static_cast<const OptionsOf<decltype(table)>&>(options);
    json out = json::object();
    for (const auto& o : table.options) out[o.name] = o.get(typed);
    return out;
  });
}

void set_group_options(const std::string& kind, torch::optim::OptimizerOptions& options, const json& saved,
                       const std::string& where) {
  with_kind(kind, [&](const auto& table) {
    auto& typed = static_cast<OptionsOf<decltype(table)>&>(options);
    FSDP_CHECK(saved.is_object(), where, ": the saved hyperparameters are not an object");
    for (const auto& o : table.options) {
      FSDP_CHECK(saved.contains(o.name), where, ": the saved hyperparameters lack '", o.name, "'");
      try {
        o.set(typed, saved[o.name]);
      } catch (const std::exception&) {
        throw Error(where + ": the saved hyperparameter '" + o.name + "' is " + saved[o.name].dump() +
                    ", of the wrong type");
      }
    }
    return 0;
  });
}

namespace {

// LRScheduler keeps its step count protected; a member pointer taken
// through a derived class reads and writes it on any scheduler.
struct SchedulerAccess : torch::optim::LRScheduler {
  static constexpr auto kStepCount = &SchedulerAccess::step_count_;
};

}  // namespace

json SchedulerState::state_dict() const {
  return {{"step_count", scheduler_.*SchedulerAccess::kStepCount}};
}

void SchedulerState::load_state_dict(const json& state) {
  FSDP_CHECK(state.is_object() && state.contains("step_count") && state["step_count"].is_number_unsigned(),
             "an LR scheduler's saved state must be {\"step_count\": N}, not ", state.dump());
  scheduler_.*SchedulerAccess::kStepCount = state["step_count"].get<unsigned>();
}

}  // namespace fsdp::checkpoint
