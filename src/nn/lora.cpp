#include "fsdp/nn/lora.h"

#include <atomic>
#include <cmath>
#include <map>
#include <set>

#include "fsdp/common/deferred_tensor.h"
#include "fsdp/common/error.h"
#include "fsdp/nn/layers.h"

namespace fsdp::nn {
namespace {

std::string last_part(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// "all-linear" leaves out the output head (as PEFT's does) and the
// routers of Mixture-of-Experts layers (Qwen3-MoE's `gate`, Llama 4's
// `router`), whose few outputs pick experts rather than carry features.
bool in_all_linear(const std::string& layer) { return layer != "lm_head" && layer != "gate" && layer != "router"; }

std::string joined(const std::set<std::string>& names) {
  std::string text;
  for (const auto& n : names) text += (text.empty() ? "" : ", ") + n;
  return text;
}

}  // namespace

std::vector<std::string> add_lora(torch::nn::Module& model, const LoraOptions& o) {
  FSDP_CHECK(o.rank > 0, "LoRA: rank ", o.rank, ": expected at least 1");
  FSDP_CHECK(o.dropout >= 0 && o.dropout < 1, "LoRA: dropout ", o.dropout, ": expected a probability in [0, 1)");
  const bool all = o.targets.size() == 1 && o.targets.front() == "all-linear";
  const std::set<std::string> wanted(o.targets.begin(), o.targets.end());
  std::set<std::string> linear_names, matched_targets;
  std::vector<std::pair<std::string, LinearImpl*>> chosen;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* linear = dynamic_cast<LinearImpl*>(item.value().get());
    if (linear == nullptr) continue;
    const std::string layer = last_part(item.key());
    linear_names.insert(layer);
    FSDP_CHECK(!linear->lora_A, "LoRA: '", item.key(), "' already has adapters");
    if (all ? in_all_linear(layer) : wanted.count(layer) > 0) {
      chosen.emplace_back(item.key(), linear);
      matched_targets.insert(layer);
    }
  }
  FSDP_CHECK(wanted.count("lm_head") == 0, "LoRA: target 'lm_head': the output head is applied as a weight (the loss "
             "and generation multiply by it directly), so an adapter there would never train; leave it out");
  if (!all) {
    for (const auto& t : wanted) {
      FSDP_CHECK(matched_targets.count(t) > 0, "LoRA: target '", t, "' names no Linear layer of this model; its "
                 "Linear layers are ", linear_names.empty() ? std::string("(none)") : joined(linear_names),
                 ", or all-linear");
    }
  }
  FSDP_CHECK(!chosen.empty(), "LoRA: no layer of this model to adapt (its Linear layers: ",
             linear_names.empty() ? std::string("none; its projections are of another kind") : joined(linear_names),
             ")");
  for (auto& p : model.parameters()) p.set_requires_grad(false);
  for (auto& [name, linear] : chosen) {
    const int64_t out = linear->weight.size(0), in = linear->weight.size(1);
    linear->lora_A = std::make_shared<LinearImpl>(in, o.rank, /*bias=*/false);
    linear->lora_B = std::make_shared<LinearImpl>(o.rank, out, /*bias=*/false);
    {
      torch::NoGradGuard no_grad;
      // PEFT's defaults: A as nn.Linear's kaiming_uniform(a = sqrt(5)),
      // U(-1/sqrt(in), 1/sqrt(in)); B zero.
      if (!is_deferred(linear->lora_A->weight)) {
        const double bound = 1.0 / std::sqrt(static_cast<double>(in));
        linear->lora_A->weight.uniform_(-bound, bound);
        linear->lora_B->weight.zero_();
      }
    }
    // The adapters follow the base's device; their dtype stays the
    // module's (fp32), whatever the frozen base's.
    if (!linear->weight.device().is_cpu()) {
      linear->lora_A->to(linear->weight.device());
      linear->lora_B->to(linear->weight.device());
    }
    linear->register_module("lora_A", linear->lora_A);
    linear->register_module("lora_B", linear->lora_B);
    if (o.dropout > 0) {
      linear->lora_dropout = linear->register_module("lora_dropout", torch::nn::Dropout(o.dropout));
    }
    linear->lora_scale = o.scale();
  }
  std::vector<std::string> names;
  for (const auto& c : chosen) names.push_back(c.first);
  return names;
}

bool is_lora_parameter(const std::string& fqn) {
  return fqn.find(".lora_A.") != std::string::npos || fqn.find(".lora_B.") != std::string::npos;
}

std::vector<std::pair<std::string, torch::Tensor>> merge_lora(
    const std::vector<std::pair<std::string, torch::Tensor>>& params, double scale) {
  std::map<std::string, torch::Tensor> by_name(params.begin(), params.end());
  std::vector<std::pair<std::string, torch::Tensor>> merged;
  torch::NoGradGuard no_grad;
  for (const auto& [name, value] : params) {
    if (is_lora_parameter(name)) continue;
    const std::string suffix = ".weight";
    const bool weight = name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    const std::string layer = weight ? name.substr(0, name.size() - suffix.size()) : "";
    const auto a = by_name.find(layer + ".lora_A.weight");
    if (!weight || a == by_name.end()) {
      merged.emplace_back(name, value);
      continue;
    }
    const auto b = by_name.find(layer + ".lora_B.weight");
    FSDP_CHECK(b != by_name.end(), "LoRA: '", layer, "' has lora_A but no lora_B");
    const torch::Tensor delta = torch::matmul(b->second.to(torch::kFloat), a->second.to(torch::kFloat)) * scale;
    merged.emplace_back(name, value.to(torch::kFloat) + delta);
  }
  return merged;
}

namespace {
std::atomic<int> g_adapters_off{0};
}  // namespace

AdaptersOff::AdaptersOff() { ++g_adapters_off; }
AdaptersOff::~AdaptersOff() { --g_adapters_off; }
bool adapters_off() { return g_adapters_off.load() > 0; }

}  // namespace fsdp::nn
