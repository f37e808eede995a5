#include "train_flags.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <tuple>
#include <vector>

#include "fsdp/common/error.h"
#include "fsdp/common/suggest.h"
#include "fsdp/models/registry.h"

namespace fsdp::cli {
namespace {

// One flag per configuration key, from the config's own table: the flag's
// type and default in --help are the ones the YAML schema checks.
void add_key_flags(CLI::App* cmd, TrainFlags& flags) {
  for (const auto& key : train::TrainConfig::describe()) {
    std::string help = key.help + " (" + key.dotted + ")";
    if (key.dotted == "model.name") help += "; presets: " + models::preset_help();
    const std::string dotted = key.dotted;
    const bool boolean = key.boolean;
    auto* option = cmd->add_option_function<std::string>(
        key.flag,
        [&flags, dotted, boolean](const std::string& v) {
          // `--flag` alone means true; `--flag=false` turns a default-on key off.
          flags.overrides.emplace_back(dotted, boolean && v.empty() ? "true" : v);
        },
        help);
    option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // argparse's rule: the last one wins
    // Help ends in "(default X)" (main.cpp's HelpFormatter), an empty default shows none.
    if (boolean) {
      // Not as default_str: CLI11 would hand a bare `--flag` that instead of "".
      option->expected(0, 1)->type_name("[BOOL]")->description(help + " (default " + key.default_value + ")");
    } else {
      option->type_name(key.type)->default_str(key.default_value);
    }
  }
}

// Paths a config file names are relative to the directory fsdp runs in,
// as torchtitan's and most trainers' are; run from elsewhere, they are
// missing. Said before anything starts, naming the directory they were
// resolved against and, where the path is there, the config file's folder.
void check_config_file_paths(const train::TrainConfig& from_file, const train::TrainConfig& config,
                             const std::string& config_path) {
  namespace fs = std::filesystem;
  const std::vector<std::tuple<const char*, std::string, std::string>> inputs = {
      {"data.train", from_file.data.train, config.data.train},
      {"data.val", from_file.data.val, config.data.val},
      {"model.init_from", from_file.model.init_from, config.model.init_from},
      {"sample.tokenizer", from_file.sample.tokenizer, config.sample.tokenizer},
  };
  const fs::path config_dir = fs::absolute(config_path).parent_path();
  for (const auto& [key, in_file, now] : inputs) {
    // Only what the file set and nothing overrode; one plain relative path.
    if (in_file.empty() || in_file != now || in_file == "synthetic" || fs::path(in_file).is_absolute() ||
        in_file.find_first_of("*?[,") != std::string::npos || fs::exists(in_file)) {
      continue;
    }
    std::string where;
    for (const fs::path& base : {config_dir, config_dir.parent_path()}) {
      if (fs::exists(base / in_file)) {
        where = "; it is there relative to " + base.string() + ": run from there, or make the path absolute";
        break;
      }
    }
    throw Error("--config '" + config_path + "' sets " + key + ": '" + in_file + "', which is not in " +
                fs::current_path().string() + " (paths in a config file are relative to the directory fsdp runs in)" +
                where);
  }
}

}  // namespace

void add_train_flags(CLI::App* cmd, TrainFlags& flags) {
  cmd->add_option("--config", flags.config_path,
                  "YAML file with sections " + join_words(train::TrainConfig::sections()));
  add_key_flags(cmd, flags);
  cmd->add_option("--set", flags.sets, "section.key=value, any configuration key (repeatable)");
}

train::TrainConfig resolve(const TrainFlags& flags) {
  train::TrainConfig config;
  if (!flags.config_path.empty()) config.load_yaml(flags.config_path);
  const train::TrainConfig from_file = config;
  for (const auto& [key, value] : flags.overrides) config.set(key, value, "command line");
  for (const auto& s : flags.sets) {
    const auto eq = s.find('=');
    if (eq == std::string::npos) throw Error("--set '" + s + "': expected section.key=value");
    config.set(s.substr(0, eq), s.substr(eq + 1), "--set");
  }
  // Printing the configuration reads no file it names.
  if (!flags.config_path.empty() && !flags.print_config) check_config_file_paths(from_file, config, flags.config_path);
  // --init-from chooses the model: no preset name stands for it in what the
  // run records (config.yaml, the checkpoint); a --model beside it is said
  // to be unused (rank 0 says it).
  if (!config.model.init_from.empty()) {
    const bool named = std::any_of(flags.overrides.begin(), flags.overrides.end(),
                                   [](const auto& kv) { return kv.first == "model.name"; });
    const char* rank = std::getenv("RANK");
    if (named && !config.model.name.empty() && (rank == nullptr || std::string(rank) == "0")) {
      std::fprintf(stderr, "note: --init-from %s chooses the model; --model %s is not used\n",
                   config.model.init_from.c_str(), config.model.name.c_str());
    }
    config.model.name.clear();
  }
  config.validate();
  return config;
}

}  // namespace fsdp::cli
