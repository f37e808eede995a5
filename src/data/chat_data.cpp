#include "fsdp/data/chat_data.h"

#include <algorithm>
#include <cstdint>

#include "fsdp/common/error.h"

namespace fsdp::data {
namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kRoles[] = {"system", "user", "assistant", "tool"};

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// A list of messages, checked: objects with a known role and string content
// (an assistant's may be absent or null beside tool_calls).
void check_messages(const Json& messages, const std::string& where, const std::string& field) {
  FSDP_CHECK(messages.is_array() && !messages.empty(), where, ": \"", field,
             "\" is not a non-empty list of messages ({\"role\": ..., \"content\": ...})");
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string which = where + ": \"" + field + "\" message " + std::to_string(i + 1);
    FSDP_CHECK(m.is_object(), which, " is not an object ({\"role\": ..., \"content\": ...})");
    FSDP_CHECK(m.contains("role") && m["role"].is_string(), which, " has no string \"role\"");
    const std::string role = m["role"].get<std::string>();
    FSDP_CHECK(std::find(std::begin(kRoles), std::end(kRoles), role) != std::end(kRoles), which, " has the role '",
               role, "'; expected one of system, user, assistant, tool");
    const bool calls = role == "assistant" && m.contains("tool_calls");
    FSDP_CHECK((m.contains("content") && m["content"].is_string()) ||
                   (calls && (!m.contains("content") || m["content"].is_null())),
               which, " (", role, ") has no string \"content\"");
  }
}

}  // namespace

bool is_chat_record(const Json& record) {
  return record.is_object() && (record.contains("messages") || (record.contains("prompt") && record.contains("completion")) ||
                                is_preference_record(record));
}

bool is_preference_record(const Json& record) {
  return record.is_object() && record.contains("chosen") && record.contains("rejected");
}

ChatEncoder::ChatEncoder(const std::string& tokenizer_dir, const Tokenizer& tokenizer, bool require_template)
    : prefix_(tokenizer.template_prefix()) {
  for (const auto& [name, token] : tokenizer.special_tokens()) special_tokens_[name] = token;
  if (auto eos = tokenizer.special_tokens().find("eos_token"); eos != tokenizer.special_tokens().end()) {
    eos_ = eos->second;
    const auto ids = tokenizer.encode(eos_);
    if (ids.size() == 1) eos_id_ = ids[0];
  }
  const auto source = chat_template_source(tokenizer_dir);
  if (!source) {
    FSDP_CHECK(!require_template, "'", tokenizer_dir, "' has no chat template (chat_template.jinja, or ",
               "tokenizer_config.json's \"chat_template\"), which conversations are rendered with; use the model's ",
               "own Hugging Face directory as --tokenizer");
    return;
  }
  template_where_ = "the chat template of '" + tokenizer_dir + "'";
  try {
    template_ = std::make_unique<ChatTemplate>(*source);
  } catch (const Error& e) {
    throw Error(template_where_ + " cannot be rendered by fsdp.cpp: " + e.what());
  }
}

ChatEncoder::~ChatEncoder() = default;

Json ChatEncoder::context(const Json& messages, bool add_generation_prompt, const Json& record) const {
  Json c = special_tokens_.is_null() ? Json::object() : special_tokens_;
  c["messages"] = messages;
  const Json tools = record.contains("tools") ? record["tools"] : Json();
  // As transformers' apply_chat_template: tools are a list of definitions,
  // and the template's own arguments cannot be set twice.
  FSDP_CHECK(tools.is_null() || tools.is_array(), "\"tools\" is a ", tools.type_name(),
             ": expected a list of tool definitions (JSON schemas), as apply_chat_template takes them");
  c["tools"] = tools;
  c["add_generation_prompt"] = add_generation_prompt;
  if (record.contains("chat_template_kwargs") && record["chat_template_kwargs"].is_object()) {
    for (const auto& [key, value] : record["chat_template_kwargs"].items()) {
      FSDP_CHECK(key != "messages" && key != "tools" && key != "documents" && key != "add_generation_prompt" &&
                     key != "continue_final_message",
                 "chat_template_kwargs sets \"", key, "\", which the record itself gives the template (",
                 "apply_chat_template refuses it twice); put it in the record, not in chat_template_kwargs");
      c[key] = value;
    }
  }
  return c;
}

std::string ChatEncoder::render(const Json& messages, bool add_generation_prompt, const Json& extra) const {
  FSDP_CHECK(template_ != nullptr, "no chat template to render the conversation with");
  // As `data prepare` checks them: an unknown role rendered nothing, and a
  // message without content reached the template's own error.
  check_messages(messages, "the conversation", "messages");
  Json record = Json::object();
  if (!extra.is_null()) record["chat_template_kwargs"] = extra;
  return template_->render(context(messages, add_generation_prompt, record));
}

Example ChatEncoder::encode(const Json& record, const Tokenizer& tokenizer, const std::string& where) const {
  FSDP_CHECK(is_chat_record(record) && !is_preference_record(record), where, ": expected chat data: {\"messages\": [...]} or {\"prompt\": ..., ",
             "\"completion\": ...}");
  const auto rendered = [&](const Json& messages, bool add_generation_prompt) {
    FSDP_CHECK(template_ != nullptr, where, ": conversations need a chat template, and the tokenizer has none");
    try {
      return template_->render(context(messages, add_generation_prompt, record));
    } catch (const Error& e) {
      throw Error(where + ": " + template_where_ + ": " + e.what());
    }
  };
  Example out;
  // [Note: where an answer's loss starts]: see chat_data.h.
  if (record.contains("messages")) {
    const Json& messages = record["messages"];
    check_messages(messages, where, "messages");
    const std::string whole = rendered(messages, false);
    out.tokens = tokenizer.encode(whole);
    out.trained.assign(out.tokens.size(), 0);
    bool any = false;
    for (size_t k = 0; k < messages.size(); ++k) {
      if (messages[k]["role"] != "assistant") continue;
      any = true;
      const Json before(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(k));
      const std::string prompt = before.empty() ? std::string() : rendered(before, true);
      if (whole.compare(0, prompt.size(), prompt) != 0) {
        // What precedes this answer in the whole conversation is not what
        // the model sees when it generates it (Mistral's tools go before
        // the last user message only): the answer is left out of the loss.
        ++out.answers_left_out;
        continue;
      }
      const size_t start = common_prefix(tokenizer.encode(prompt), out.tokens);
      // The answer's own text, where the rendering holds it as given: the
      // turn's end is looked for after it, so a special token inside the
      // answer ("hello <|persona|>!") does not end the turn.
      size_t end = start;
      bool text_seen = false;
      const Json& content = messages[k].contains("content") ? messages[k]["content"] : Json();
      if (content.is_string() && !content.get<std::string>().empty()) {
        const std::string& text = content.get_ref<const std::string&>();
        const size_t at = whole.find(text, prompt.size());
        if (at != std::string::npos) {
          end = std::max(end, common_prefix(tokenizer.encode(whole.substr(0, at + text.size())), out.tokens));
          text_seen = true;
        }
      }
      // The turn ends at the end-of-sequence token, or at the first special
      // token after the answer's text (a tool call's own opening token,
      // Mistral's [TOOL_CALLS], is the answer's), whichever comes first;
      // then its line breaks.
      while (end < out.tokens.size()) {
        const int32_t id = out.tokens[end];
        if (id == eos_id_ || (text_seen && tokenizer.is_special(id))) break;
        text_seen = text_seen || !tokenizer.is_special(id);
        ++end;
      }
      if (end < out.tokens.size()) ++end;
      while (end < out.tokens.size() && !tokenizer.is_special(out.tokens[end])) {
        const std::string text = tokenizer.decode({out.tokens[end]});
        if (text.empty() || text.find_first_not_of(" \t\r\n") != std::string::npos) break;
        ++end;
      }
      std::fill(out.trained.begin() + static_cast<std::ptrdiff_t>(start),
                out.trained.begin() + static_cast<std::ptrdiff_t>(end), uint8_t{1});
    }
    FSDP_CHECK(any, where, ": the conversation has no assistant message, so nothing in it would be trained");
    FSDP_CHECK(out.answers_left_out < static_cast<int64_t>(std::count_if(messages.begin(), messages.end(), [](const Json& m) {
                 return m["role"] == "assistant";
               })),
               where, ": the chat template renders the messages before each assistant message, with "
               "add_generation_prompt, into a text that does not begin the whole conversation's, so no answer can be "
               "trained on the context the model sees when it generates it");
    return out;
  }
  const Json& prompt = record["prompt"];
  const Json& completion = record["completion"];
  std::vector<int32_t> prompt_tokens;
  if (prompt.is_string() && completion.is_string()) {
    std::string answer = completion.get<std::string>();
    if (!eos_.empty() && (answer.size() < eos_.size() || answer.compare(answer.size() - eos_.size(), eos_.size(), eos_) != 0)) {
      answer += eos_;
    }
    prompt_tokens = prefix_;
    const auto p = tokenizer.encode(prompt.get<std::string>());
    prompt_tokens.insert(prompt_tokens.end(), p.begin(), p.end());
    out.tokens = prefix_;
    const auto all = tokenizer.encode(prompt.get<std::string>() + answer);
    out.tokens.insert(out.tokens.end(), all.begin(), all.end());
  } else if (prompt.is_array() && completion.is_array()) {
    check_messages(prompt, where, "prompt");
    check_messages(completion, where, "completion");
    Json both = prompt;
    for (const auto& m : completion) both.push_back(m);
    prompt_tokens = tokenizer.encode(rendered(prompt, true));
    out.tokens = tokenizer.encode(rendered(both, false));
  } else {
    throw Error(where + ": \"prompt\" and \"completion\" are expected both strings or both lists of messages, not a " +
                prompt.type_name() + " and a " + completion.type_name());
  }
  const size_t start = common_prefix(prompt_tokens, out.tokens);
  out.trained.assign(out.tokens.size(), 0);
  std::fill(out.trained.begin() + static_cast<std::ptrdiff_t>(start), out.trained.end(), uint8_t{1});
  return out;
}

std::array<Example, 2> ChatEncoder::encode_preference(const Json& record, const Tokenizer& tokenizer,
                                                      const std::string& where) const {
  FSDP_CHECK(is_preference_record(record), where, ": expected preference data: {\"prompt\": ..., \"chosen\": ..., ",
             "\"rejected\": ...}");
  FSDP_CHECK(record.contains("prompt"), where, ": a preference record needs its \"prompt\" apart from \"chosen\" and ",
             "\"rejected\" (each of which is then only the answer)");
  FSDP_CHECK(!record.contains("completion") && !record.contains("messages"), where, ": a preference record has ",
             "\"chosen\" and \"rejected\" answers, not \"completion\" or \"messages\" too");
  std::array<Example, 2> out;
  size_t start = SIZE_MAX;
  const char* sides[] = {"chosen", "rejected"};
  for (size_t k = 0; k < 2; ++k) {
    Json pair = record;
    pair.erase("chosen");
    pair.erase("rejected");
    pair["completion"] = record[sides[k]];
    out[k] = encode(pair, tokenizer, where + " (\"" + sides[k] + "\")");
    const auto first = std::find(out[k].trained.begin(), out[k].trained.end(), uint8_t{1});
    start = std::min(start, static_cast<size_t>(first - out[k].trained.begin()));
  }
  // TRL's prompt is the shorter of the two common prefixes: both answers
  // train from there.
  for (auto& example : out) {
    std::fill(example.trained.begin(), example.trained.end(), uint8_t{0});
    std::fill(example.trained.begin() + static_cast<std::ptrdiff_t>(std::min(start, example.trained.size())),
              example.trained.end(), uint8_t{1});
  }
  return out;
}

}  // namespace fsdp::data
