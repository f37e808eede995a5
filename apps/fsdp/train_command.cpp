// `fsdp train`: configuration from --config, flags and --set, then the trainer.

#include <cstdio>

#include "commands.h"
#include "dist_flags.h"
#include "train_flags.h"
#include "fsdp/common/error.h"
#include "fsdp/common/suggest.h"
#include "fsdp/models/registry.h"
#include "fsdp/train/config.h"
#include "fsdp/train/trainer.h"

namespace fsdp::cli {

void add_train_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<TrainFlags>();
  auto dist_flags = std::make_shared<DistFlags>();
  std::vector<std::string> families;
  for (const auto& family : models::families()) families.push_back(family.name);
  auto* cmd = app.add_subcommand("train", "train a model with FSDP (families: " + join_words(families) + ")");
  dist_flags->add_to(*cmd);
  add_train_flags(cmd, *flags);
  cmd->add_flag("--print-config", flags->print_config, "print the effective configuration and exit");
  cmd->callback([flags, dist_flags, &exit_code] {
    const train::TrainConfig config = resolve(*flags);
    if (flags->print_config) {
      std::printf("%s", config.to_yaml().c_str());
      exit_code = 0;
      return;
    }
    auto world = dist_flags->init_world();
    train::Trainer trainer(config, world);
    const auto summary = trainer.train();
    exit_code = summary.stopped_by_signal != 0 ? 128 + summary.stopped_by_signal : 0;
  });
}

}  // namespace fsdp::cli
