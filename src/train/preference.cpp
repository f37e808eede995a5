#include "fsdp/train/preference.h"

#include "fsdp/common/error.h"
#include "fsdp/distributed/collectives.h"

namespace fsdp::train {

PreferenceTerms preference_terms(const torch::Tensor& policy, const torch::Tensor& reference,
                                 const torch::Tensor& answer_tokens, const TrainConfig::Objective& objective) {
  FSDP_CHECK(policy.dim() == 1 && policy.size(0) % 2 == 0 && reference.sizes() == policy.sizes() &&
                 answer_tokens.sizes() == policy.sizes(),
             "preference_terms: expected (2P) log-probabilities of P chosen then P rejected answers");
  const double beta = objective.beta;
  const auto halves = policy.chunk(2);
  const auto reference_halves = reference.to(policy.dtype()).chunk(2);
  const torch::Tensor chosen_ratio = halves[0] - reference_halves[0];
  const torch::Tensor rejected_ratio = halves[1] - reference_halves[1];
  PreferenceTerms out;
  switch (objective.loss) {
    case DpoLoss::kSigmoid: {
      const torch::Tensor logits = beta * (chosen_ratio - rejected_ratio);
      const double e = objective.label_smoothing;
      out.losses = -torch::log_sigmoid(logits) * (1 - e) - torch::log_sigmoid(-logits) * e;
      break;
    }
    case DpoLoss::kIpo: {
      const auto counts = answer_tokens.to(policy.dtype()).clamp_min(1.0).chunk(2);
      const torch::Tensor delta = chosen_ratio / counts[0] - rejected_ratio / counts[1];
      out.losses = (delta - 1.0 / (2.0 * beta)).pow(2);
      break;
    }
    case DpoLoss::kHinge:
      out.losses = torch::relu(1.0 - beta * (chosen_ratio - rejected_ratio));
      break;
  }
  out.chosen_rewards = (beta * chosen_ratio).detach();
  out.rejected_rewards = (beta * rejected_ratio).detach();
  out.chosen_logps = halves[0].detach();
  out.rejected_logps = halves[1].detach();
  return out;
}

void PreferenceStats::add(const PreferenceTerms& t) {
  pairs += static_cast<double>(t.chosen_rewards.size(0));
  chosen_rewards += t.chosen_rewards.sum().item<double>();
  rejected_rewards += t.rejected_rewards.sum().item<double>();
  correct += t.chosen_rewards.gt(t.rejected_rewards).sum().item<double>();
  margins += (t.chosen_rewards - t.rejected_rewards).sum().item<double>();
  chosen_logps += t.chosen_logps.sum().item<double>();
  rejected_logps += t.rejected_logps.sum().item<double>();
}

void PreferenceStats::sum_over(dist::ProcessGroup& group) {
  auto t = torch::tensor({pairs, chosen_rewards, rejected_rewards, correct, margins, chosen_logps, rejected_logps},
                         torch::kDouble);
  dist::all_reduce(group, t, dist::ReduceOp::kSum).wait();
  const auto* v = t.data_ptr<double>();
  pairs = v[0], chosen_rewards = v[1], rejected_rewards = v[2], correct = v[3], margins = v[4], chosen_logps = v[5],
  rejected_logps = v[6];
}

std::vector<std::pair<std::string, double>> PreferenceStats::means() const {
  const double n = std::max(pairs, 1.0);
  return {{"rewards/chosen", chosen_rewards / n},   {"rewards/rejected", rejected_rewards / n},
          {"rewards/accuracies", correct / n},      {"rewards/margins", margins / n},
          {"logps/chosen", chosen_logps / n},       {"logps/rejected", rejected_logps / n}};
}

}  // namespace fsdp::train
