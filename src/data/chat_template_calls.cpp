// Chat templates' calls: transformers' globals (raise_exception,
// strftime_now), Jinja's (namespace, dict, range), and Python's string
// and dict methods (strip, split, replace, get, items, ...).

#include <ctime>

#include "chat_template_renderer.h"

namespace fsdp::data::jinja {

Value Renderer::call(const Expr& e) {
  const Value f = eval(*e.operands[0]);
  const int line = e.line;
  if (f.kind != Value::Kind::kCallable) {
    fail(line,
         (f.defined() ? std::string("a value") : "'" + f.name + "'") + " is not a function in the supported subset");
  }
  const Evaluated args = evaluate(e.arguments);
  const std::string& name = f.name;
  if (!f.self) {
    if (name == "raise_exception") {
      throw Error("the chat template refuses the conversation: " + text(args.at(0, "message", line, name), line));
    }
    if (name == "strftime_now") {
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      ::localtime_r(&now, &local);
      const std::string format = text(args.at(0, "format", line, name), line);
      std::string out(format.size() * 8 + 64, '\0');
      const size_t n = std::strftime(out.data(), out.size(), format.c_str(), &local);
      if (n == 0 && !format.empty()) fail(line, "strftime_now('" + format + "') writes nothing or too much");
      out.resize(n);
      return Value::of(out);
    }
    if (name == "namespace" || name == "dict") {
      Json attributes = Json::object();
      if (!args.positional.empty()) attributes = data(args.positional[0], line, "a namespace's attributes");
      for (const auto& [key, value] : args.named) attributes[key] = data(value, line, "a namespace's attribute");
      check_nesting(attributes, line);
      charge_items(attributes.size(), line);
      if (name == "dict") return Value::of(attributes);
      Value ns;
      ns.kind = Value::Kind::kNamespace;
      ns.ns = std::make_shared<Json>(attributes);
      return ns;
    }
    // range
    int64_t start = 0, stop = 0, step = 1;
    const auto integer = [&](size_t i) { return data(args.positional.at(i), line, "a range bound").get<int64_t>(); };
    if (args.positional.size() == 1) {
      stop = integer(0);
    } else if (args.positional.size() >= 2) {
      start = integer(0);
      stop = integer(1);
      if (args.positional.size() > 2) step = integer(2);
    }
    if (step == 0) fail(line, "range() with a step of 0");
    Json out = Json::array();
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      // Jinja's sandbox refuses ranges of more than 100,000 items.
      if (out.size() >= 100000) fail(line, "range() of more than 100000 items");
      charge_items(1, line);
      out.push_back(i);
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    return Value::of(out);
  }
  const Json& self = *f.self;
  if (self.is_object()) {
    if (name == "get") {
      const std::string key = text(args.at(0, "key", line, "get"), line);
      if (self.contains(key)) return Value::of(self[key]);
      const Value* fallback = args.maybe(1, "default");
      return fallback ? *fallback : Value::of(nullptr);
    }
    Json out = Json::array();
    for (const auto& [key, value] : self.items()) {
      out.push_back(name == "items" ? Json::array({key, value}) : name == "keys" ? Json(key) : value);
    }
    return Value::of(out);
  }
  const std::string s = self.get<std::string>();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = args.maybe(0, "chars");
    return Value::of(strip(s, chars && chars->is_data() ? chars->data : Json(), name != "rstrip", name != "lstrip"));
  }
  if (name == "startswith" || name == "endswith") {
    const std::string part = text(args.at(0, "prefix", line, name), line);
    const bool starts = s.compare(0, part.size(), part) == 0;
    const bool ends = s.size() >= part.size() && s.compare(s.size() - part.size(), part.size(), part) == 0;
    return Value::of(name == "startswith" ? starts : ends);
  }
  if (name == "split") {
    only(args, 2, {"sep", "maxsplit"}, line, name);
    const Value* separator = args.maybe(0, "sep");
    const Value* most = args.maybe(1, "maxsplit");
    int64_t splits = -1;
    if (most && most->is_data()) {
      if (!most->data.is_number_integer()) fail(line, "split's maxsplit must be an integer");
      splits = most->data.get<int64_t>();
    }
    Json out = Json::array();
    if (!separator || !separator->is_data() || separator->data.is_null()) {
      if (splits >= 0) fail(line, "split(None, maxsplit) is outside the supported subset");
      std::string word;
      for (const auto& c : characters(s)) {
        if (python_space(c)) {
          if (!word.empty()) out.push_back(word);
          word.clear();
        } else {
          word += c;
        }
      }
      if (!word.empty()) out.push_back(word);
      return made(std::move(out), line);
    }
    const std::string sep = text(*separator, line);
    if (sep.empty()) fail(line, "split() with an empty separator");
    size_t start = 0;
    for (size_t at = s.find(sep); at != std::string::npos && splits != 0; at = s.find(sep, start)) {
      out.push_back(s.substr(start, at - start));
      start = at + sep.size();
      if (splits > 0) --splits;
    }
    out.push_back(s.substr(start));
    return made(std::move(out), line);
  }
  if (name == "replace") {
    only(args, 3, {"old", "new", "count"}, line, name);
    const Value* count = args.maybe(2, "count");
    int64_t n = -1;
    if (count && count->is_data()) {
      if (!count->data.is_number_integer()) fail(line, "replace's count must be an integer");
      n = count->data.get<int64_t>();
    }
    const std::string from = text(args.at(0, "old", line, name), line), to = text(args.at(1, "new", line, name), line);
    charge(replaced_size(s, from, to, n), line);
    return Value::of(replace_all(s, from, to, n));
  }
  only(args, 0, {}, line, name);
  if (name == "upper" || name == "lower") return made(change_case(s, name == "upper"), line);
  return made(title_case(s, name == "title"), line);
}

}  // namespace fsdp::data::jinja
