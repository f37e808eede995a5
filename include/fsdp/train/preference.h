#pragma once
// Direct Preference Optimization's loss (Rafailov et al., 2023) over a
// batch of preference pairs, as TRL's DPOTrainer computes it: each pair's
// chosen and rejected answers scored by their log-likelihood under the
// policy and under a frozen reference, and the loss taken on the margin
//   delta = (log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected)).
//   sigmoid: -log sigmoid(beta * delta), or with label smoothing e (cDPO)
//            -(1 - e) log sigmoid(beta * delta) - e log sigmoid(-beta * delta);
//   ipo:     (delta' - 1 / (2 beta))^2, delta' on log-ratios divided by each
//            answer's token count (TRL's normalisation);
//   hinge:   relu(1 - beta * delta).
// The rewards TRL logs are beta times each answer's log-ratio.

#include <torch/torch.h>

#include "fsdp/distributed/process_group.h"
#include "fsdp/train/config.h"

namespace fsdp::train {

struct PreferenceTerms {
  torch::Tensor losses;                            // (P) per pair, with the policy's gradient
  torch::Tensor chosen_rewards, rejected_rewards;  // (P) beta * log-ratio, detached
  torch::Tensor chosen_logps, rejected_logps;      // (P) the policy's, detached
};

// policy and reference: (2P) summed log-probabilities of the batch's rows,
// the P chosen answers then the P rejected ones (data::DataLoader's
// layout); answer_tokens: (2P) the targets each row's sum covers.
PreferenceTerms preference_terms(const torch::Tensor& policy, const torch::Tensor& reference,
                                 const torch::Tensor& answer_tokens, const TrainConfig::Objective& objective);

// A step's (or an evaluation's) pairs, summed over micro-batches and
// then ranks: the means TRL logs under these names.
struct PreferenceStats {
  double pairs = 0, chosen_rewards = 0, rejected_rewards = 0, correct = 0, margins = 0, chosen_logps = 0,
         rejected_logps = 0;
  void add(const PreferenceTerms& terms);
  void sum_over(dist::ProcessGroup& group);
  // {"rewards/chosen": mean, ...}
  std::vector<std::pair<std::string, double>> means() const;
};

}  // namespace fsdp::train
