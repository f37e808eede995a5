// Chat templates, rendered: the parsed subset walked over JSON values with
// Python's and Jinja's semantics where the supported templates can tell
// (str() of values, slices by characters, undefined values, loop scopes),
// and transformers' globals (raise_exception, strftime_now, its tojson).
// The renderer's parts are laid out in chat_template_renderer.h; this file
// holds ChatTemplate, the renderer's frames, and its bounds.

#include "fsdp/data/chat_template.h"

#include <algorithm>
#include <filesystem>

#include "chat_template_renderer.h"
#include "fsdp/common/error.h"
#include "fsdp/io/input_file.h"

namespace fsdp::data {
namespace jinja {

Renderer::Renderer(const Json& context, std::string& out) : out_(out) {
  frames_.emplace_back();
  for (const auto& [key, value] : context.items()) frames_.back()[key] = Value::of(value);
  for (const char* global : {"raise_exception", "strftime_now", "namespace", "range", "dict"}) {
    if (!frames_.back().count(global)) frames_.back()[global] = Value::callable(global);
  }
}

// [Note: a template's bounds]
// Every string a render makes (the output, '~' and '+', '*', filters,
// string methods) and every list or dict item (16 bytes each) is charged
// to one budget of kMaxRenderBytes, checked before anything large is
// built ('*', '+', '~' and replace know their result's size first), so a
// template that doubles a string or a list in a loop, or multiplies one
// by 10^11, is refused within the budget's time and memory. Loops count
// their iterations, nested ones included, against kMaxLoopIterations
// (range() alone stops at 100,000, as Jinja's sandbox's). Values built by
// the template nest at most kMaxValueNesting deep, so no recursive copy,
// comparison or tojson runs out of stack. The source is bounded by
// kMaxTemplateBytes before it is parsed (ChatTemplate), and read no
// further than that (chat_template_source).
void Renderer::charge(int64_t bytes, int line) {
  produced_ += bytes;
  if (produced_ > kMaxRenderBytes) {
    fail(line, "the render makes more than " + std::to_string(kMaxRenderBytes >> 20) +
                   " MiB of strings and lists (a template that repeats or doubles them without bound); refused");
  }
}
void Renderer::charge_items(size_t n, int line) { charge(static_cast<int64_t>(n) * 16, line); }
void Renderer::count_iteration(int line) {
  if (++iterations_ > kMaxLoopIterations) {
    fail(line, "the render's loops run more than " + std::to_string(kMaxLoopIterations) +
                   " iterations (nested loops over large ranges); refused");
  }
}
// Refuses `j` (about to go inside a new list or dict) when it nests
// kMaxValueNesting deep already; visits no deeper than that.
void Renderer::check_nesting(const Json& j, int line) const {
  if (nesting(j, kMaxValueNesting) >= kMaxValueNesting) {
    fail(line, "a list or dict nests deeper than " + std::to_string(kMaxValueNesting) + " levels; refused");
  }
}
int Renderer::nesting(const Json& j, int limit) {
  if (!j.is_array() && !j.is_object()) return 0;
  if (limit <= 0) return 1;
  int deepest = 0;
  for (const auto& item : j) {
    if (item.is_array() || item.is_object()) deepest = std::max(deepest, nesting(item, limit - 1));
    if (deepest >= limit) break;
  }
  return deepest + 1;
}
Value Renderer::made(std::string s, int line) {
  charge(static_cast<int64_t>(s.size()), line);
  return Value::of(std::move(s));
}
Value Renderer::made(Json j, int line) {
  if (j.is_string()) {
    charge(static_cast<int64_t>(j.get_ref<const std::string&>().size()), line);
  } else if (j.is_array() || j.is_object()) {
    charge_items(j.size(), line);
  }
  return Value::of(std::move(j));
}

}  // namespace jinja

namespace {

const std::string& bounded_source(const std::string& source) {
  FSDP_CHECK(static_cast<int64_t>(source.size()) <= kMaxTemplateBytes, "chat template: ", source.size(),
             " bytes; a template is at most ", kMaxTemplateBytes >> 20, " MiB (real ones are a few KB); refused");
  return source;
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source) : template_(jinja::parse(bounded_source(source))) {}
ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  std::string out;
  jinja::Renderer renderer(context, out);
  try {
    renderer.body(template_->body);
  } catch (const nlohmann::json::exception& e) {
    // A value of a kind the operation does not take (a string's float()).
    throw Error(std::string("chat template: a value of the wrong kind (") + e.what() + ")");
  }
  return out;
}

std::optional<std::string> chat_template_source(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path jinja_file = fs::path(dir) / "chat_template.jinja";
  if (fs::exists(jinja_file)) {
    std::error_code ec;
    const auto size = fs::file_size(jinja_file, ec);
    FSDP_CHECK(ec || static_cast<int64_t>(size) <= kMaxTemplateBytes, "chat template '", jinja_file.string(),
               "': ", size, " bytes; a template is at most ", kMaxTemplateBytes >> 20,
               " MiB (real ones are a few KB); refused");
    return io::read_file(jinja_file.string(), "chat template");
  }
  const fs::path config = fs::path(dir) / "tokenizer_config.json";
  if (!fs::exists(config)) return std::nullopt;
  const auto j = io::read_json_file(config.string(), "tokenizer config");
  if (!j.contains("chat_template") || j["chat_template"].is_null()) return std::nullopt;
  const auto& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const auto& named : t) {
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string()) {
        return named["template"].get<std::string>();
      }
    }
  }
  throw Error("'" + config.string() + "': chat_template is neither a string nor a list holding a \"default\" template");
}

}  // namespace fsdp::data
