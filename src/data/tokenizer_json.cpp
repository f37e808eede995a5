// Reading a Hugging Face tokenizer.json into byte-level BPE tables. Every
// component that changes the ids is either honoured or refused by name: a
// tokenizer that silently differs from the one a model was trained with
// would corrupt every token file made with it.

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/data/tokenizer.h"
#include "tokenizer_tables.h"

namespace fsdp::data {
namespace {

using nlohmann::json;

const char* const kSupported = "fsdp reads byte-level BPE tokenizers, as GPT-2, Llama 3 and Qwen write them";

std::string type_of(const json& component, const std::string& where, const char* what) {
  FSDP_CHECK(component.is_object() && component.contains("type") && component["type"].is_string(), where, ": ", what,
             " has no \"type\"");
  return component["type"].get<std::string>();
}

bool flag(const json& component, const char* key, bool fallback) {
  const auto it = component.find(key);
  if (it == component.end() || it->is_null()) return fallback;
  return it->is_boolean() ? it->get<bool>() : fallback;
}

// A field that must be absent, null, or one of the values this code implements.
void require(const json& component, const char* key, const std::vector<json>& allowed, const std::string& where,
             const char* what) {
  const auto it = component.find(key);
  if (it == component.end() || it->is_null()) return;
  for (const auto& a : allowed) {
    if (*it == a) return;
  }
  throw Error(where + ": " + what + " \"" + key + "\": " + it->dump() + " is not supported (" + kSupported + ")");
}

void read_normalizer(const json& n, TokenizerTables& t, const std::string& where) {
  if (n.is_null()) return;
  const auto type = type_of(n, where, "normalizer");
  if (type == "Sequence") {
    for (const auto& each : n.value("normalizers", json::array())) read_normalizer(each, t, where);
  } else if (type == "NFC") {
    t.nfc = true;
  } else {
    throw Error(where + ": normalizer '" + type + "' is not supported (NFC is; " + kSupported + ")");
  }
}

// Returns whether a ByteLevel step was seen.
bool read_pre_tokenizer(const json& p, TokenizerTables& t, const std::string& where) {
  FSDP_CHECK(!p.is_null(), where, ": no pre_tokenizer (", kSupported, ": they split text with ByteLevel)");
  const auto type = type_of(p, where, "pre_tokenizer");
  using Kind = TokenizerTables::Step::Kind;
  if (type == "Sequence") {
    bool byte_level = false;
    for (const auto& each : p.value("pretokenizers", json::array())) byte_level |= read_pre_tokenizer(each, t, where);
    return byte_level;
  }
  if (type == "ByteLevel") {
    if (flag(p, "add_prefix_space", false)) t.steps.push_back({Kind::kPrefixSpace, nullptr});
    if (flag(p, "use_regex", true)) {
      t.steps.push_back({Kind::kSplit, compile_split_pattern(kGpt2SplitPattern, false, where)});
    }
    return true;
  }
  if (type == "Split") {
    require(p, "behavior", {"Isolated"}, where, "Split pre_tokenizer");
    require(p, "invert", {false}, where, "Split pre_tokenizer");
    const auto& pattern = p.value("pattern", json::object());
    const bool regex = pattern.contains("Regex") && pattern["Regex"].is_string();
    FSDP_CHECK(regex || (pattern.contains("String") && pattern["String"].is_string()), where,
               ": Split pre_tokenizer has no \"pattern\" {\"Regex\": ...} or {\"String\": ...}");
    t.steps.push_back(
        {Kind::kSplit, compile_split_pattern(pattern[regex ? "Regex" : "String"].get<std::string>(), !regex, where)});
    return false;
  }
  throw Error(where + ": pre_tokenizer '" + type + "' is not supported (" + kSupported + ")");
}

// A special token named in tokenizer_config.json: a string or {"content": ...}.
std::string special_token(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

json parse(const std::string& text, const std::string& what) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(what + " is not valid JSON (" + e.what() + ")");
  }
}

int32_t token_id(const json& id, const std::string& where, const std::string& token) {
  FSDP_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (1 << 24), where, ": token '",
             token, "' has id ", id.dump(), "; expected an integer in 0..", (1 << 24) - 1);
  return id.get<int32_t>();
}

std::shared_ptr<TokenizerTables> read_tables(const json& j, const json& config, const std::string& where) {
  FSDP_CHECK(j.is_object() && j.contains("model"), where, " is not a Hugging Face tokenizer.json (no \"model\")");
  auto t = std::make_shared<TokenizerTables>();
  t->source = where;

  const json& model = j["model"];
  const auto model_type = model.is_object() && model.contains("type") ? model["type"].get<std::string>() : "BPE";
  FSDP_CHECK(model_type == "BPE", where, ": model '", model_type, "' is not supported (", kSupported, ")");
  require(model, "dropout", {0, 0.0}, where, "BPE model");
  require(model, "byte_fallback", {false}, where, "BPE model");
  require(model, "continuing_subword_prefix", {""}, where, "BPE model");
  require(model, "end_of_word_suffix", {""}, where, "BPE model");
  t->ignore_merges = flag(model, "ignore_merges", false);
  FSDP_CHECK(model.contains("vocab") && model["vocab"].is_object() && !model["vocab"].empty(), where,
             ": model has no \"vocab\" object (token -> id)");
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    t->vocab[it.key()] = token_id(*it, where, it.key());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  for (const auto& m : model.value("merges", json::array())) {
    // Two spellings: "a b" (older files) and ["a", "b"].
    if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      continue;
    }
    const auto s = m.is_string() ? m.get<std::string>() : std::string();
    const auto space = s.find(' ');
    FSDP_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos, where, ": merge ", m.dump(),
               " is neither \"a b\" nor [\"a\", \"b\"]");
    merges.emplace_back(s.substr(0, space), s.substr(space + 1));
  }

  for (const auto& a : j.value("added_tokens", json::array())) {
    FSDP_CHECK(a.is_object() && a.contains("content") && a["content"].is_string() && a.contains("id"), where,
               ": added token ", a.dump(), " has no \"content\" and \"id\"");
    const auto content = a["content"].get<std::string>();
    FSDP_CHECK(!content.empty(), where, ": an added token (id ", a["id"].dump(), ") is empty");
    for (const char* key : {"single_word", "lstrip", "rstrip"}) {
      FSDP_CHECK(!flag(a, key, false), where, ": added token '", content, "' sets \"", key,
                 "\", which is not supported (", kSupported, ")");
    }
    t->added.push_back({content, token_id(a["id"], where, content)});
  }

  read_normalizer(j.value("normalizer", json()), *t, where);
  FSDP_CHECK(read_pre_tokenizer(j.value("pre_tokenizer", json()), *t, where), where,
             ": the pre_tokenizer has no ByteLevel step (", kSupported, ")");
  const json decoder = j.value("decoder", json());
  FSDP_CHECK(!decoder.is_null() && type_of(decoder, where, "decoder") == "ByteLevel", where, ": decoder ",
             decoder.dump(), " is not supported (", kSupported, ": their decoder is ByteLevel)");
  // post_processor only adds template tokens (Hugging Face's
  // add_special_tokens), which encode() never does; truncation and padding
  // concern batches of model inputs, not documents.

  FSDP_CHECK(config.is_null() || config.is_object(), where, ": its tokenizer_config.json is not a JSON object");
  finish_tables(*t, merges, special_token(config, "bos_token"), special_token(config, "eos_token"));
  return t;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_tokenizer_json_text(const std::string& tokenizer_json,
                                                               const std::string& tokenizer_config_json,
                                                               const std::string& where) {
  const json j = parse(tokenizer_json, where);
  const json config =
      tokenizer_config_json.empty() ? json() : parse(tokenizer_config_json, where + "'s tokenizer_config.json");
  try {
    return std::make_unique<Tokenizer>(read_tables(j, config, where));
  } catch (const json::exception& e) {
    // A field of the wrong type somewhere the checks above do not look.
    throw Error(where + " is not a tokenizer.json this code can read (" + e.what() + ")");
  }
}

std::unique_ptr<Tokenizer> Tokenizer::from_tokenizer_json(const std::string& path, const std::string& config_path) {
  return from_tokenizer_json_text(read_tokenizer_file(path),
                                  config_path.empty() ? "" : read_tokenizer_file(config_path), "'" + path + "'");
}

}  // namespace fsdp::data
