#pragma once
// The configuration flags `fsdp train` and `fsdp plan` share: --config,
// one flag per configuration key, --set, resolved into a TrainConfig.

#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "fsdp/train/config.h"

namespace fsdp::cli {

struct TrainFlags {
  std::string config_path;
  std::vector<std::pair<std::string, std::string>> overrides;  // (section.key, value) from named flags
  std::vector<std::string> sets;                               // section.key=value
  bool print_config = false;
};

// --config, a flag per configuration key, and --set.
void add_train_flags(CLI::App* cmd, TrainFlags& flags);

// The configuration the flags describe, validated.
train::TrainConfig resolve(const TrainFlags& flags);

}  // namespace fsdp::cli
