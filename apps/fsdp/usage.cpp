#include "usage.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "fsdp/common/suggest.h"

namespace fsdp::cli {
namespace {

// The named subcommands of `command` (not its option groups).
std::vector<const CLI::App*> commands_of(const CLI::App& command) {
  return command.get_subcommands([](const CLI::App* sub) { return !sub->get_name().empty(); });
}

// Whether `text` is a whole number of the kind a type name ("INT", "FLOAT")
// promises.
bool is_number(const std::string& text, bool integer) {
  char* end = nullptr;
  if (integer) {
    (void)std::strtoll(text.c_str(), &end, 10);
  } else {
    (void)std::strtod(text.c_str(), &end);
  }
  return !text.empty() && *end == '\0';
}

// A default as help shows it: quoted, with escapes, when it is empty or
// holds spaces or control characters (sample.prompt's "\n").
std::string shown_default(const std::string& text) {
  bool plain = !text.empty();
  std::string escaped;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == ' ' || c == '"' || c == '\\' || byte < 0x20) plain = false;
    if (c == '\n') {
      escaped += "\\n";
    } else if (c == '\t') {
      escaped += "\\t";
    } else if (c == '"' || c == '\\') {
      escaped += std::string("\\") + c;
    } else if (byte < 0x20) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", byte);
      escaped += hex;
    } else {
      escaped += c;
    }
  }
  return plain ? text : "\"" + escaped + "\"";
}

// One look for every command's help: the name, its value's type, then the
// description ending in "(default X)", the style hand-written help uses
// where the default is a sentence ("(default: a free port)"). CLI11 would
// put a captured default after the type ("INT=64") and a flag's own value
// after its name ("--no-prefix{false}").
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_name(const CLI::Option* option, bool positional) const override {
    std::string name = CLI::Formatter::make_option_name(option, positional);
    for (auto open = name.find('{'); open != std::string::npos; open = name.find('{')) {
      const auto close = name.find('}', open);
      if (close == std::string::npos) break;
      name.erase(open, close - open + 1);
    }
    return name;
  }

  std::string make_option_opts(const CLI::Option* option) const override {
    if (!option->get_option_text().empty()) return " " + option->get_option_text();
    std::string out;
    if (option->get_type_size() != 0) {
      if (!option->get_type_name().empty()) out += " " + get_label(option->get_type_name());
      if (option->get_expected_max() == CLI::detail::expected_max_vector_size) {
        out += " ...";
      } else if (option->get_expected_min() > 1) {
        out += " x " + std::to_string(option->get_expected());
      }
      if (option->get_required()) out += " " + get_label("REQUIRED");
    }
    if (!option->get_envname().empty()) out += " (" + get_label("Env") + ":" + option->get_envname() + ")";
    if (!option->get_needs().empty()) {
      out += " " + get_label("Needs") + ":";
      for (const auto* other : option->get_needs()) out += " " + other->get_name();
    }
    if (!option->get_excludes().empty()) {
      out += " " + get_label("Excludes") + ":";
      for (const auto* other : option->get_excludes()) out += " " + other->get_name();
    }
    return out;
  }

  std::string make_option_desc(const CLI::Option* option) const override {
    const std::string value = option->get_default_str();
    if (value.empty()) return option->get_description();
    return option->get_description() + " (default " + shown_default(value) + ")";
  }
};

}  // namespace

// "did you mean --steps?" for a mistyped flag of the chosen subcommand.
std::string unexpected_argument(const CLI::App& app) {
  const CLI::App* command = &app;
  std::string path = "fsdp";
  while (!command->get_subcommands().empty()) {
    command = command->get_subcommands().front();
    path += " " + command->get_name();
  }
  std::vector<std::string> names;
  for (const auto* option : command->get_options()) {
    for (const auto& name : option->get_lnames()) names.push_back("--" + name);
  }
  const std::string help = " (`" + path + " --help` lists its options)";
  // What CLI11 left over, in the order it was typed (its own message lists
  // it backwards); a dashed word first, since the value after it is only
  // left over because of it.
  const auto left = app.remaining(true);
  for (const auto& word : left) {
    if (word.size() < 2 || word[0] != '-') continue;
    const std::string name = word.substr(0, word.find('='));
    return "unknown option '" + name + "' for '" + path + "'" + fsdp::did_you_mean(name, names) + help;
  }
  return "unexpected argument '" + (left.empty() ? std::string() : left.front()) + "' for '" + path + "'" + help;
}

// "unknown command 'trian'; did you mean 'train'? (commands: ...)" when the
// words before the first flag name a command that does not exist; "" when
// they all exist. CLI11 itself calls the word an unexpected argument, or
// says a subcommand is required.
std::string unknown_command(const CLI::App& app, int argc, char** argv) {
  const CLI::App* command = &app;
  std::string path = "fsdp";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const auto subs = commands_of(*command);
    const bool takes_words = !command->get_options([](const CLI::Option* o) { return o->get_positional(); }).empty();
    if (word.empty() || word[0] == '-' || subs.empty() || takes_words) return "";
    const CLI::App* next = nullptr;
    std::vector<std::string> names;
    for (const auto* sub : subs) {
      if (sub->check_name(word)) next = sub;
      names.push_back(sub->get_name());
    }
    if (next == nullptr) {
      return "unknown command '" + word + "'" + (command == &app ? "" : " for '" + path + "'") +
             fsdp::did_you_mean(word, names) + " (commands: " + fsdp::join_words(names) + ")";
    }
    command = next;
    path += " " + word;
  }
  return "";
}

// CLI11 gives an option the next argument as its value even when that is a
// flag (`--lr --steps 3` sets --lr to "--steps", then finds "3" unexpected),
// so that `--lr -1` reaches the range check that explains it. Refuse a
// value that is another flag of the command, or a dashed word where a
// number belongs: "--lr: expected a number, got the flag '--steps'". The
// check goes first, before an option's own (a range's "could not be
// converted").
void refuse_flags_as_values(CLI::App& command) {
  std::vector<std::string> flags;
  for (const auto* option : command.get_options()) {
    for (const auto& name : option->get_lnames()) flags.push_back("--" + name);
    for (const auto& name : option->get_snames()) flags.push_back("-" + name);
  }
  for (auto* option : command.get_options()) {
    if (option->get_positional() || option->get_items_expected_min() < 1) continue;
    const std::string type = option->get_type_name().substr(0, option->get_type_name().find(':'));
    const bool integer = type == "INT" || type == "UINT";
    const std::string expected = integer ? "an integer" : type == "FLOAT" ? "a number" : "a value";
    option->transform(CLI::Validator(
        [flags, integer, numeric = integer || type == "FLOAT", expected](std::string& value) -> std::string {
          if (value.empty() || value[0] != '-' || (numeric && is_number(value, integer))) return "";
          const std::string name = value.substr(0, value.find('='));
          if (std::find(flags.begin(), flags.end(), name) != flags.end()) {
            return "expected " + expected + ", got the flag '" + value + "'";
          }
          return numeric ? "expected " + expected + ", got '" + value + "'" : "";
        },
        ""));
  }
  for (auto* sub : command.get_subcommands([](CLI::App*) { return true; })) refuse_flags_as_values(*sub);
}

std::shared_ptr<CLI::Formatter> help_formatter() { return std::make_shared<HelpFormatter>(); }

}  // namespace fsdp::cli
