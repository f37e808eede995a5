#pragma once
// A model's chat template, rendered in C++ as transformers'
// apply_chat_template renders it (Jinja with trim_blocks and lstrip_blocks,
// raise_exception, strftime_now, and its tojson). The renderer holds the
// subset of Jinja the supported families' templates use (Llama 3.x, Qwen3
// with its thinking blocks, Mistral): statements if, for (with a filter,
// loop.*, else), set (namespaces too), break, continue, generation;
// Python's string and dict methods and Jinja's common filters and tests. A
// template outside it is refused when parsed, naming the line and the
// construct, never rendered approximately. Light header: no LibTorch.
//
// A template is code from a downloaded file, so its size and each render's
// work are bounded, as transformers' sandboxed Jinja environment and
// llama.cpp's template engine bound theirs: past a bound the template is
// refused by name (fsdp::Error), never left to run out of time or memory.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace fsdp::data {

// The bounds ([Note: a template's bounds] in chat_template_render.cpp).
// Real templates are a few KB; their renders produce about their
// conversation's size and loop over its messages.
constexpr int64_t kMaxTemplateBytes = int64_t{1} << 20;  // the template's source
constexpr int64_t kMaxRenderBytes = int64_t{256} << 20;  // strings (and 16 bytes a list item) one render makes
constexpr int64_t kMaxLoopIterations = 1'000'000;        // for-loop iterations of one render, nested ones included
constexpr int kMaxValueNesting = 128;                    // lists and dicts inside each other, in one value

namespace jinja {
struct Template;
}

class ChatTemplate {
 public:
  // Throws fsdp::Error for a template outside the subset.
  explicit ChatTemplate(const std::string& source);
  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // CONTEXT's keys are the template's variables: messages,
  // add_generation_prompt, the special tokens (bos_token, ...), tools and
  // any the template reads (enable_thinking). Throws fsdp::Error when the
  // template raises or does what the subset cannot (an undefined value's
  // attribute, a string added to a number).
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  std::unique_ptr<jinja::Template> template_;
};

// The chat template of a model or tokenizer directory, as transformers
// finds it: chat_template.jinja, else tokenizer_config.json's
// chat_template (a string, or the one named "default" of a list). None
// when the directory has none.
std::optional<std::string> chat_template_source(const std::string& dir);

}  // namespace fsdp::data
