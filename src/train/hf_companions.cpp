#include "fsdp/train/hf_companions.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "fsdp/common/error.h"
#include "fsdp/io/input_file.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/io/atomic_file.h"

namespace fsdp::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kIdKeys[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
constexpr const char* kGpt2EndOfText = "<|endoftext|>";

bool is_file(const fs::path& p) { return fs::is_regular_file(p); }

nlohmann::json read_json(const fs::path& path) { return io::read_json_file(path.string(), "file"); }

// A special token as tokenizer_config.json names it: a string, or an
// object with its content (transformers' AddedToken).
std::string token_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return "";
}

// The id tokenizer.json gives TEXT: among its added tokens, then its vocabulary.
std::optional<int64_t> id_in_tokenizer_json(const nlohmann::json& tokenizer, const std::string& text) {
  if (text.empty()) return std::nullopt;
  if (const auto added = tokenizer.find("added_tokens"); added != tokenizer.end() && added->is_array()) {
    for (const auto& token : *added) {
      const auto content = token.find("content"), id = token.find("id");
      if (content != token.end() && *content == text && id != token.end() && id->is_number_integer()) {
        return id->get<int64_t>();
      }
    }
  }
  const auto model = tokenizer.find("model");
  if (model == tokenizer.end() || !model->is_object()) return std::nullopt;
  const auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object()) return std::nullopt;
  const auto id = vocab->find(text);
  if (id != vocab->end() && id->is_number_integer()) return id->get<int64_t>();
  return std::nullopt;
}

nlohmann::json tokenizer_ids(const fs::path& dir) {
  nlohmann::json ids = nlohmann::json::object();
  if (is_file(dir / "tokenizer.json")) {
    if (!is_file(dir / "tokenizer_config.json")) return ids;
    const auto config = read_json(dir / "tokenizer_config.json");
    const auto tokenizer = read_json(dir / "tokenizer.json");
    for (const char* role : {"bos", "eos", "pad"}) {
      const std::string key = std::string(role) + "_token";
      if (!config.contains(key)) continue;
      if (const auto id = id_in_tokenizer_json(tokenizer, token_text(config[key]))) ids[key + "_id"] = *id;
    }
  } else if (const auto files = data::gpt2_bpe_files(dir.string())) {
    const auto encoder = read_json(files->first);
    if (encoder.contains(kGpt2EndOfText)) ids["bos_token_id"] = ids["eos_token_id"] = encoder[kGpt2EndOfText];
  }
  return ids;
}

void copy_into(const fs::path& from, const fs::path& to) {
  if (fs::exists(to) && fs::equivalent(from, to)) return;
  std::ifstream in(from, std::ios::binary);
  FSDP_CHECK(in.good(), "cannot read '", from.string(), "'");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  io::write_file_atomically(to.string(), bytes.str());
}

void write_json(const fs::path& path, const nlohmann::json& value) {
  io::write_file_atomically(path.string(), value.dump(2) + "\n");
}

}  // namespace

CompanionSources companion_sources(const TrainConfig& config) {
  const auto& init_from = config.model.init_from;
  std::string tokenizer = config.sample.tokenizer;
  if (tokenizer.empty()) {
    tokenizer = !init_from.empty() && data::has_tokenizer(init_from) ? init_from : data::default_tokenizer_dir();
  }
  return {init_from, tokenizer};
}

nlohmann::json special_token_ids(const CompanionSources& sources) {
  nlohmann::json ids = nlohmann::json::object();
  const fs::path model_dir = sources.model_dir;
  if (!sources.model_dir.empty() && is_file(model_dir / "config.json")) {
    const auto config = read_json(model_dir / "config.json");
    for (const char* key : kIdKeys) {
      if (config.contains(key) && !config[key].is_null()) ids[key] = config[key];
    }
  }
  if (!sources.tokenizer_dir.empty()) {
    const nlohmann::json from_tokenizer = tokenizer_ids(sources.tokenizer_dir);  // items() refers to it
    for (const auto& [key, value] : from_tokenizer.items()) {
      if (!ids.contains(key)) ids[key] = value;
    }
  }
  return ids;
}

std::vector<int64_t> end_of_text_ids(const std::string& model_dir) {
  for (const char* file : {"generation_config.json", "config.json"}) {
    const fs::path path = fs::path(model_dir) / file;
    if (!is_file(path)) continue;
    const auto config = read_json(path);
    const auto eos = config.find("eos_token_id");
    if (eos == config.end() || eos->is_null()) continue;
    std::vector<int64_t> ids;
    for (const auto& id : eos->is_array() ? *eos : nlohmann::json::array({*eos})) {
      FSDP_CHECK(id.is_number_integer(), "'", path.string(), "': eos_token_id holds ", id.dump(),
                 "; expected an integer id or a list of them");
      ids.push_back(id.get<int64_t>());
    }
    return ids;
  }
  return {};
}

std::vector<int64_t> end_of_text_ids(const CompanionSources& sources) {
  if (!sources.model_dir.empty()) {
    auto ids = end_of_text_ids(sources.model_dir);
    if (!ids.empty()) return ids;
  }
  const auto eos = special_token_ids(sources).value("eos_token_id", nlohmann::json());
  std::vector<int64_t> ids;
  for (const auto& id : eos.is_array() ? eos : nlohmann::json::array({eos})) {
    if (id.is_number_integer()) ids.push_back(id.get<int64_t>());
  }
  return ids;
}

CompanionReport write_hf_companions(const CompanionSources& sources, int64_t model_vocab, const std::string& out_dir) {
  CompanionReport report;
  const fs::path out = out_dir;
  const fs::path model_dir = sources.model_dir;
  const fs::path tokenizer_dir = sources.tokenizer_dir;

  // Whether the tokenizer's ids all fit the embedding: only then is it
  // written, and only then do its special tokens say anything of this model.
  bool tokenizer_fits = false;
  if (sources.tokenizer_dir.empty() || !data::has_tokenizer(sources.tokenizer_dir)) {
    report.note = sources.tokenizer_dir.empty() ? "no tokenizer was given"
                                                : "'" + sources.tokenizer_dir + "' holds no tokenizer";
  } else if (const auto vocab = data::Tokenizer::from_dir(sources.tokenizer_dir)->vocab_size(); vocab > model_vocab) {
    report.note = "the tokenizer in '" + sources.tokenizer_dir + "' has " + std::to_string(vocab) +
                  " tokens, more than the model's vocabulary of " + std::to_string(model_vocab);
  } else {
    tokenizer_fits = true;
  }

  // config.json: the ids the model came with override the family's
  // defaults; the tokenizer's fill only what is unset.
  // An adapter directory (PEFT's) has no config.json: the base model's
  // ids and generation settings are the base's own, and only the tokenizer
  // and chat template go beside it.
  const bool adapter = !is_file(out / "config.json");
  const nlohmann::json from_model = special_token_ids({sources.model_dir, ""});
  const nlohmann::json ids = special_token_ids({sources.model_dir, tokenizer_fits ? sources.tokenizer_dir : ""});
  auto config = adapter ? nlohmann::json::object() : read_json(out / "config.json");
  bool changed = false;
  for (const auto& [key, value] : ids.items()) {
    // A decoder family's config.json states its padding row, null
    // included: the tokenizer's pad token would give the exported model one
    // that the trained model did not have (transformers' padding_idx).
    if (key == "pad_token_id" && config.contains(key) && !from_model.contains(key)) continue;
    if (from_model.contains(key) || !config.contains(key) || config[key].is_null()) {
      changed |= config[key] != value;
      config[key] = value;
    }
  }
  if (changed && !adapter) write_json(out / "config.json", config);

  // generation_config.json: the model's own, else the ids `generate` stops at.
  if (adapter) {
    // The base's.
  } else if (!sources.model_dir.empty() && is_file(model_dir / "generation_config.json")) {
    copy_into(model_dir / "generation_config.json", out / "generation_config.json");
    report.written.push_back("generation_config.json");
  } else {
    nlohmann::json generation = nlohmann::json::object();
    for (const char* key : kIdKeys) {
      if (config.contains(key) && !config[key].is_null()) generation[key] = config[key];
    }
    if (!generation.empty()) {
      write_json(out / "generation_config.json", generation);
      report.written.push_back("generation_config.json");
    }
  }

  // The tokenizer, when its ids all fit the embedding.
  if (!tokenizer_fits) {
    // Said in the report.
  } else if (is_file(tokenizer_dir / "tokenizer.json")) {
    for (const char* file : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"}) {
      if (!is_file(tokenizer_dir / file)) continue;
      copy_into(tokenizer_dir / file, out / file);
      report.written.push_back(file);
    }
  } else if (const auto files = data::gpt2_bpe_files(sources.tokenizer_dir)) {
    // GPT-2's files as transformers names them, and the config that says
    // which class reads them and which token ends a text.
    copy_into(files->first, out / "vocab.json");
    copy_into(files->second, out / "merges.txt");
    write_json(out / "tokenizer_config.json",
               {{"tokenizer_class", "GPT2Tokenizer"}, {"add_prefix_space", false}, {"bos_token", kGpt2EndOfText},
                {"eos_token", kGpt2EndOfText}, {"unk_token", kGpt2EndOfText}, {"model_max_length", 1024}});
    write_json(out / "special_tokens_map.json",
               {{"bos_token", kGpt2EndOfText}, {"eos_token", kGpt2EndOfText}, {"unk_token", kGpt2EndOfText}});
    for (const char* file : {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"}) {
      report.written.push_back(file);
    }
  }

  // The chat template and special-tokens map of the model directory.
  if (!sources.model_dir.empty()) {
    for (const char* file : {"chat_template.jinja", "chat_template.json", "special_tokens_map.json"}) {
      if (!is_file(model_dir / file) || is_file(out / file)) continue;
      copy_into(model_dir / file, out / file);
      report.written.push_back(file);
    }
  }
  return report;
}

}  // namespace fsdp::train
