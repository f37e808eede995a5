// Reading a Hugging Face tokenizer.json into BPE tables, byte-level or
// SentencePiece-style. Every component that changes the ids is either
// honoured or refused by name: a tokenizer that silently differs from the
// one a model was trained with would corrupt every token file made with it.

#include <algorithm>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/io/input_file.h"
#include "tokenizer_tables.h"
#include "utf8.h"

namespace fsdp::data {
namespace {

using nlohmann::json;

const char* const kSupported =
    "fsdp reads BPE tokenizers, byte-level as GPT-2, Llama 3 and Qwen write them or SentencePiece-style as Llama 2 "
    "and Mistral write them";

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

// A string field the component must have.
std::string text(const json& component, const char* key, const std::string& where, const char* what) {
  const auto it = component.find(key);
  FSDP_CHECK(it != component.end() && it->is_string(), where, ": ", what, " has no \"", key, "\" string");
  return it->get<std::string>();
}

// A field that must be one character (Hugging Face reads it as a Rust char).
std::string character(const json& component, const char* key, const std::string& where, const char* what) {
  const auto c = text(component, key, where, what);
  const size_t length = c.empty() ? 1 : utf8_length(static_cast<unsigned char>(c[0]));
  FSDP_CHECK(!c.empty() && c.size() == length, where, ": ", what, " \"", key, "\" is \"", c,
             "\"; expected one character");
  return c;
}

// A boolean field, `fallback` when absent or null.
bool boolean(const json& component, const char* key, bool fallback, const std::string& where, const char* what) {
  const auto it = component.find(key);
  if (it == component.end() || it->is_null()) return fallback;
  FSDP_CHECK(it->is_boolean(), where, ": ", what, " \"", key, "\" is ", it->dump(), "; expected true or false");
  return it->get<bool>();
}

// Replace's {"pattern": {"String": from}, "content": to}.
std::pair<std::string, std::string> replacement(const json& component, const std::string& where, const char* what) {
  const auto& pattern = component.value("pattern", json::object());
  FSDP_CHECK(!(pattern.is_object() && pattern.contains("Regex")), where, ": ", what, " with a \"Regex\" pattern is ",
             "not supported (a \"String\" pattern is; ", kSupported, ")");
  FSDP_CHECK(pattern.is_object() && pattern.contains("String") && pattern["String"].is_string() &&
                 !pattern["String"].get<std::string>().empty(),
             where, ": ", what, " has no \"pattern\" {\"String\": ...} that is not empty");
  return {pattern["String"].get<std::string>(), text(component, "content", where, what)};
}

// Metaspace's prepend_scheme, or its older add_prefix_space, read as
// Hugging Face reads them (add_prefix_space false must say "never").
TokenizerTables::Step::Prepend prepend_scheme(const json& component, const std::string& where, const char* what) {
  using Prepend = TokenizerTables::Step::Prepend;
  auto scheme = Prepend::kAlways;
  const auto it = component.find("prepend_scheme");
  if (it != component.end() && !it->is_null()) {
    FSDP_CHECK(*it == "always" || *it == "first" || *it == "never", where, ": ", what, " \"prepend_scheme\": ",
               it->dump(), " is not supported (always, first and never are)");
    scheme = *it == "always" ? Prepend::kAlways : *it == "first" ? Prepend::kFirst : Prepend::kNever;
  }
  FSDP_CHECK(boolean(component, "add_prefix_space", true, where, what) || scheme == Prepend::kNever, where, ": ",
             what, " sets \"add_prefix_space\": false, which contradicts its \"prepend_scheme\" (absent means "
             "\"always\"); Hugging Face refuses this file too");
  return scheme;
}

void read_normalizer(const json& n, TokenizerTables& t, const std::string& where) {
  if (n.is_null()) return;
  const auto type = type_of(n, where, "normalizer");
  using Kind = TokenizerTables::Normalizer::Kind;
  if (type == "Sequence") {
    for (const auto& each : n.value("normalizers", json::array())) read_normalizer(each, t, where);
  } else if (type == "NFC") {
    t.normalizers.push_back({Kind::kNfc, "", ""});
  } else if (type == "Prepend") {
    t.normalizers.push_back({Kind::kPrepend, text(n, "prepend", where, "Prepend normalizer"), ""});
  } else if (type == "Replace") {
    const auto [from, to] = replacement(n, where, "Replace normalizer");
    t.normalizers.push_back({Kind::kReplace, from, to});
  } else {
    throw Error(where + ": normalizer '" + type + "' is not supported (NFC, Prepend, Replace and Sequence are; " +
                kSupported + ")");
  }
}

// Which steps a pre_tokenizer has that decide the tokenizer's kind.
struct Seen {
  bool byte_level = false, metaspace = false;
};

void read_pre_tokenizer(const json& p, TokenizerTables& t, const std::string& where, Seen& seen) {
  if (p.is_null()) return;  // SentencePiece-style without Metaspace: the normalizer wrote the "▁"s (Llama 2)
  const auto type = type_of(p, where, "pre_tokenizer");
  using Kind = TokenizerTables::Step::Kind;
  if (type == "Sequence") {
    for (const auto& each : p.value("pretokenizers", json::array())) read_pre_tokenizer(each, t, where, seen);
  } else if (type == "ByteLevel") {
    if (flag(p, "add_prefix_space", false)) t.steps.push_back({Kind::kPrefixSpace, nullptr});
    if (flag(p, "use_regex", true)) {
      t.steps.push_back({Kind::kSplit, compile_split_pattern(kGpt2SplitPattern, false, where)});
    }
    seen.byte_level = true;
  } else if (type == "Metaspace") {
    TokenizerTables::Step step{Kind::kMetaspace, nullptr};
    step.replacement = character(p, "replacement", where, "Metaspace pre_tokenizer");
    step.prepend = prepend_scheme(p, where, "Metaspace pre_tokenizer");
    step.split = boolean(p, "split", true, where, "Metaspace pre_tokenizer");
    t.steps.push_back(std::move(step));
    seen.metaspace = true;
  } else if (type == "Split") {
    require(p, "behavior", {"Isolated"}, where, "Split pre_tokenizer");
    require(p, "invert", {false}, where, "Split pre_tokenizer");
    const auto& pattern = p.value("pattern", json::object());
    const bool regex = pattern.contains("Regex") && pattern["Regex"].is_string();
    FSDP_CHECK(regex || (pattern.contains("String") && pattern["String"].is_string()), where,
               ": Split pre_tokenizer has no \"pattern\" {\"Regex\": ...} or {\"String\": ...}");
    t.steps.push_back(
        {Kind::kSplit, compile_split_pattern(pattern[regex ? "Regex" : "String"].get<std::string>(), !regex, where)});
  } else {
    throw Error(where + ": pre_tokenizer '" + type + "' is not supported (ByteLevel, Metaspace, Split and Sequence " +
                "are; " + kSupported + ")");
  }
}

void read_decoder(const json& d, TokenizerTables& t, const std::string& where) {
  const auto type = type_of(d, where, "decoder");
  using Decoder = TokenizerTables::Decoder;
  using Kind = Decoder::Kind;
  if (type == "Sequence") {
    for (const auto& each : d.value("decoders", json::array())) read_decoder(each, t, where);
  } else if (type == "Replace") {
    const auto [from, to] = replacement(d, where, "Replace decoder");
    t.decoders.push_back({Kind::kReplace, from, to});
  } else if (type == "ByteFallback") {
    t.decoders.push_back({Kind::kByteFallback});
  } else if (type == "Fuse") {
    t.decoders.push_back({Kind::kFuse});
  } else if (type == "Strip") {
    Decoder strip{Kind::kStrip, character(d, "content", where, "Strip decoder")};
    for (const auto& [key, count] : {std::pair{"start", &strip.start}, std::pair{"stop", &strip.stop}}) {
      const auto it = d.find(key);
      FSDP_CHECK(it != d.end() && it->is_number_unsigned(), where, ": Strip decoder \"", key, "\" is ",
                 it != d.end() ? it->dump() : "missing", "; expected a count");
      *count = it->get<size_t>();
    }
    t.decoders.push_back(strip);
  } else if (type == "Metaspace") {
    Decoder metaspace{Kind::kMetaspace, character(d, "replacement", where, "Metaspace decoder")};
    metaspace.prepend = prepend_scheme(d, where, "Metaspace decoder") != TokenizerTables::Step::Prepend::kNever;
    t.decoders.push_back(metaspace);
  } else {
    throw Error(where + ": decoder '" + type + "' is not supported (without a ByteLevel pre_tokenizer: Replace, " +
                "ByteFallback, Fuse, Strip, Metaspace and Sequence are; " + kSupported + ")");
  }
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

json parse(const std::string& text, const std::string& what) { return io::parse_json(text, what); }

// The special tokens a post-processor puts before a single text:
// TemplateProcessing's leading SpecialTokens (in a Sequence too), Bert's and
// Roberta's cls. Anything unread adds nothing.
void template_prefix_of(const json& p, std::vector<int32_t>& out) {
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) return;
  const std::string type = p["type"].get<std::string>();
  if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
    for (const auto& inner : p["processors"]) template_prefix_of(inner, out);
  } else if (type == "TemplateProcessing" && p.contains("single") && p["single"].is_array()) {
    for (const auto& piece : p["single"]) {
      if (!piece.is_object() || !piece.contains("SpecialToken")) break;
      const auto name = piece["SpecialToken"].value("id", std::string());
      const auto& specials = p.value("special_tokens", json::object());
      if (!specials.contains(name) || !specials[name].contains("ids")) break;
      for (const auto& id : specials[name]["ids"]) {
        if (id.is_number_integer()) out.push_back(id.get<int32_t>());
      }
    }
  } else if ((type == "BertProcessing" || type == "RobertaProcessing") && p.contains("cls") && p["cls"].is_array() &&
             p["cls"].size() == 2 && p["cls"][1].is_number_integer()) {
    out.push_back(p["cls"][1].get<int32_t>());
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
    // Two spellings: "a b" (older files, Llama 2's) and ["a", "b"].
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

  read_normalizer(j.value("normalizer", json()), *t, where);
  Seen seen;
  read_pre_tokenizer(j.value("pre_tokenizer", json()), *t, where, seen);
  FSDP_CHECK(!(seen.byte_level && seen.metaspace), where,
             ": the pre_tokenizer has both ByteLevel and Metaspace steps, which is not supported (", kSupported, ")");
  // Without ByteLevel, BPE starts from characters; the file's decoder says
  // how its tokens become text again.
  t->byte_level = seen.byte_level;
  const json decoder = j.value("decoder", json());
  FSDP_CHECK(!decoder.is_null(), where, ": no decoder (", kSupported, ")");
  if (t->byte_level) {
    FSDP_CHECK(type_of(decoder, where, "decoder") == "ByteLevel", where, ": decoder ", decoder.dump(),
               " is not supported (", kSupported, ": with a ByteLevel pre_tokenizer the decoder is ByteLevel)");
  } else {
    FSDP_CHECK(type_of(decoder, where, "decoder") != "ByteLevel", where,
               ": decoder 'ByteLevel' needs a ByteLevel pre_tokenizer, and the pre_tokenizer has none (", kSupported,
               ")");
    read_decoder(decoder, *t, where);
  }
  // Byte-level files leave these unused: every character BPE sees there is
  // a byte's token.
  t->byte_fallback = boolean(model, "byte_fallback", false, where, "BPE model");
  t->fuse_unk = boolean(model, "fuse_unk", false, where, "BPE model");
  const json unk = model.value("unk_token", json());
  if (!t->byte_level && !unk.is_null()) {
    FSDP_CHECK(unk.is_string() && t->vocab.count(unk.get<std::string>()), where, ": the BPE model's unk_token ",
               unk.dump(), " is not in its vocabulary");
    t->unk = t->vocab.at(unk.get<std::string>());
  }

  // Matched in the normalised text, an added token would meet the "▁"s a
  // Prepend or Replace normaliser writes; this code matches in raw text.
  const bool rewrites = std::any_of(t->normalizers.begin(), t->normalizers.end(), [](const auto& n) {
    return n.kind != TokenizerTables::Normalizer::Kind::kNfc;
  });
  for (const auto& a : j.value("added_tokens", json::array())) {
    FSDP_CHECK(a.is_object() && a.contains("content") && a["content"].is_string() && a.contains("id"), where,
               ": added token ", a.dump(), " has no \"content\" and \"id\"");
    const auto content = a["content"].get<std::string>();
    FSDP_CHECK(!content.empty(), where, ": an added token (id ", a["id"].dump(), ") is empty");
    for (const char* key : {"single_word", "lstrip", "rstrip"}) {
      FSDP_CHECK(!flag(a, key, false), where, ": added token '", content, "' sets \"", key,
                 "\", which is not supported (", kSupported, ")");
    }
    FSDP_CHECK(!rewrites || !flag(a, "normalized", false), where, ": added token '", content,
               "' sets \"normalized\" beside a Prepend or Replace normalizer, which is not supported (", kSupported,
               ")");
    t->added.push_back({content, token_id(a["id"], where, content), flag(a, "special", false)});
  }
  // post_processor adds template tokens (Hugging Face's add_special_tokens),
  // which encode() never does; the tokens it puts before a text are kept
  // for callers that need them. Truncation and padding concern batches of
  // model inputs, not documents.
  if (j.contains("post_processor")) template_prefix_of(j["post_processor"], t->template_prefix);
  for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
    if (config.is_object()) {
      if (auto token = special_token(config, key); !token.empty()) t->special_tokens[key] = token;
    }
  }

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
