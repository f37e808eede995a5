// Chat templates' filters and tests: Jinja's common ones, with
// transformers' tojson, as the parser's lists name them
// (chat_template_parse.cpp).

#include <algorithm>
#include <cmath>

#include "chat_template_renderer.h"

namespace fsdp::data::jinja {

bool Renderer::test(const std::string& name, const Value& v, const std::vector<Value>& args, int line) const {
  const auto arg = [&](size_t i) -> const Value& {
    if (i >= args.size()) fail(line, "the test '" + name + "' needs an argument");
    return args[i];
  };
  if (name == "defined") return v.defined();
  if (name == "undefined") return !v.defined();
  if (name == "equalto" || name == "eq" || name == "==") return equal(v, arg(0));
  if (name == "ne" || name == "!=") return !equal(v, arg(0));
  if (name == "in") return contains(arg(0), v, line);
  if (!v.defined()) return name == "iterable" || name == "sequence";  // Jinja's Undefined is an empty one
  if (!v.is_data()) return false;
  const Json& j = v.data;
  if (name == "none") return j.is_null();
  if (name == "string") return j.is_string();
  if (name == "number") return j.is_number() || j.is_boolean();  // Python's bool is a number
  if (name == "integer") return j.is_number_integer();
  if (name == "float") return j.is_number_float();
  if (name == "boolean") return j.is_boolean();
  if (name == "true") return j.is_boolean() && j.get<bool>();
  if (name == "false") return j.is_boolean() && !j.get<bool>();
  if (name == "mapping") return j.is_object();
  if (name == "iterable" || name == "sequence") return j.is_string() || j.is_array() || j.is_object();
  const Json& x = data(v, line, "tested");
  if (name == "odd" || name == "even") {
    const Json r = number_op("%", x, Json(2), line);
    return equal(Value::of(r), Value::of(name == "odd" ? 1 : 0));
  }
  if (name == "divisibleby") {
    return equal(Value::of(number_op("%", x, data(arg(0), line, "a divisor"), line)), Value::of(0));
  }
  const Json& y = data(arg(0), line, "compared");
  if (name == "lt") return less(x, y, line);
  if (name == "gt") return less(y, x, line);
  if (name == "le") return !less(y, x, line);
  return !less(x, y, line);  // ge
}

Value Renderer::filter(const Expr& e) {
  const Value v = eval(*e.operands[0]);
  const Evaluated args = evaluate(e.arguments);
  const std::string& f = e.name;
  const int line = e.line;
  if (f == "default" || f == "d") {
    const Value* fallback = args.maybe(0, "default_value");
    const Value* boolean = args.maybe(1, "boolean");
    const bool use = boolean && truthy(*boolean) ? !truthy(v) : !v.defined();
    return use ? (fallback ? *fallback : Value::of("")) : v;
  }
  if (f == "safe") return v;
  if (f == "length" || f == "count") return Value::of(length(v, line));
  if (f == "trim") {
    const Value* chars = args.maybe(0, "chars");
    return Value::of(strip(text(v, line), chars ? chars->data : Json(), true, true));
  }
  if (f == "string") return made(text(v, line), line);
  if (f == "upper" || f == "lower") return made(change_case(text(v, line), f == "upper"), line);
  if (f == "capitalize") return made(title_case(text(v, line), false), line);
  if (f == "replace") {
    std::string s = text(v, line);
    const std::string from = text(args.at(0, "old", line, "replace"), line);
    const std::string to = text(args.at(1, "new", line, "replace"), line);
    charge(replaced_size(s, from, to, -1), line);
    return Value::of(replace_all(s, from, to));
  }
  if (f == "tojson") {
    only(args, 1, {"indent", "sort_keys"}, line, f);
    const Value* indent = args.maybe(0, "indent");
    const Value* sort = args.maybe(99, "sort_keys");
    int width = -1;
    if (indent && indent->is_data() && !indent->data.is_null()) {
      if (!indent->data.is_number_integer() || indent->data.get<int64_t>() < 0 || indent->data.get<int64_t>() > 64) {
        fail(line, "tojson(indent=...) takes a count of spaces from 0 to 64 in the supported subset");
      }
      width = static_cast<int>(indent->data.get<int64_t>());
    }
    Json value = data(v, line, "written as JSON");
    check_nesting(value, line);
    if (sort && truthy(*sort)) value = sorted_keys(value);
    std::string out;
    dump_json(value, width, 0, out);
    return made(std::move(out), line);
  }
  if (f == "int") {
    const Json& j = data(v, line, "made an integer");
    if (j.is_boolean()) return Value::of(j.get<bool>() ? 1 : 0);
    if (j.is_number_integer()) return Value::of(j.get<int64_t>());
    if (j.is_number()) {
      const double d = j.get<double>();
      if (!(std::fabs(d) < 9.2e18)) fail(line, "int of " + str(j) + " is past 64 bits");
      return Value::of(static_cast<int64_t>(d));
    }
    try {
      return Value::of(static_cast<int64_t>(std::stoll(j.get<std::string>())));
    } catch (const std::exception&) {
      return Value::of(0);
    }
  }
  if (f == "float") {
    const Json& j = data(v, line, "made a float");
    if (j.is_number()) return Value::of(j.get<double>());
    fail(line, "float of a " + std::string(j.type_name()) + " is outside the supported subset");
  }
  if (f == "abs") {
    const Json& j = data(v, line, "made absolute");
    if (j.is_number_integer()) {
      const int64_t x = j.get<int64_t>();
      return x >= 0 ? Value::of(x) : Value::of(number_op("-", Json(0), j, line));
    }
    if (j.is_number()) return Value::of(std::fabs(j.get<double>()));
    fail(line, "abs of a " + std::string(j.type_name()));
  }
  if (f == "items") {
    Json out = Json::array();
    const Json& of = data(v, line, "asked for its items");
    check_nesting(of, line);
    charge_items(2 * of.size(), line);
    for (const auto& [key, value] : of.items()) out.push_back(Json::array({key, value}));
    return Value::of(out);
  }
  const Json list = items_of(v, line);
  charge_items(list.size(), line);
  if (f == "list") return Value::of(list);
  if (f == "first") return list.empty() ? Value::undefined("first") : Value::of(list.front());
  if (f == "last") return list.empty() ? Value::undefined("last") : Value::of(list.back());
  if (f == "reverse") {
    if (v.is_data() && v.data.is_string()) {
      std::string s;
      for (auto it = list.rbegin(); it != list.rend(); ++it) s += it->get<std::string>();
      return Value::of(s);
    }
    return Value::of(Json(std::vector<Json>(list.rbegin(), list.rend())));
  }
  if (f == "join") {
    const Value* separator = args.maybe(0, "d");
    std::string out;
    const std::string between = separator ? text(*separator, line) : "";
    for (size_t i = 0; i < list.size(); ++i) {
      std::string piece = (i ? between : "") + str(list[i]);
      charge(static_cast<int64_t>(piece.size()), line);
      out += piece;
    }
    return Value::of(out);
  }
  if (f == "unique") {
    // Jinja's default compares strings without case, keeping the first.
    only(args, 0, {}, line, f);
    Json out = Json::array();
    std::vector<Json> seen;
    for (const auto& item : list) {
      const Json key = item.is_string() ? Json(change_case(item.get<std::string>(), false)) : item;
      if (std::find(seen.begin(), seen.end(), key) == seen.end()) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::of(out);
  }
  if (f == "map") {
    only(args, 0, {"attribute"}, line, f);
    const Value* attribute_name = args.maybe(99, "attribute");
    if (!attribute_name) fail(line, "only map(attribute=...) is in the supported subset");
    Json out = Json::array();
    const std::string path = text(*attribute_name, line);
    for (const auto& item : list) {
      const Value got = attribute_path(Value::of(item), path, line);
      if (!got.defined()) fail(line, "map(attribute='" + path + "'): an item has no '" + path + "'");
      out.push_back(data(got, line, "mapped"));
    }
    return Value::of(out);
  }
  // selectattr / rejectattr
  const std::string field = text(args.at(0, "attribute", line, f), line);
  std::vector<Value> test_args(args.positional.size() > 2 ? args.positional.begin() + 2 : args.positional.end(),
                               args.positional.end());
  const std::string test_name = args.positional.size() > 1 ? text(args.positional[1], line) : "";
  if (!test_name.empty() && !is_supported_test(test_name)) {
    fail(line, "the test '" + test_name + "' is outside the supported subset");
  }
  Json out = Json::array();
  for (const auto& item : list) {
    const Value got = attribute_path(Value::of(item), field, line);
    const bool pass = test_name.empty() ? truthy(got) : test(test_name, got, test_args, line);
    if (pass == (f == "selectattr")) out.push_back(item);
  }
  return Value::of(out);
}

// The size of replace_all's result, counted without building it.
int64_t Renderer::replaced_size(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return static_cast<int64_t>(s.size());
  int64_t n = 0;
  for (size_t at = s.find(from); at != std::string::npos && (count < 0 || n < count);
       at = s.find(from, at + from.size()))
    ++n;
  return static_cast<int64_t>(s.size()) + n * (static_cast<int64_t>(to.size()) - static_cast<int64_t>(from.size()));
}

// Python's str.replace (count < 0: every occurrence).
std::string Renderer::replace_all(std::string s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {
    if (count != 0 && !to.empty())
      throw Error("chat template: replace of an empty string is outside the supported subset");
    return s;
  }
  // Built end to end: replacing in place moves the tail once per
  // occurrence, quadratic in a long string of many.
  std::string out;
  size_t done = 0;
  for (size_t at = s.find(from); at != std::string::npos && count != 0; at = s.find(from, done)) {
    out.append(s, done, at - done).append(to);
    done = at + from.size();
    if (count > 0) --count;
  }
  return out.append(s, done, std::string::npos);
}

// Refuses arguments the subset does not implement: more than `most`
// positional ones, or a name outside `names`.
void Renderer::only(const Evaluated& args, size_t most, std::initializer_list<const char*> names, int line,
                    const std::string& what) const {
  if (args.positional.size() > most) {
    fail(line, what + " with " + std::to_string(args.positional.size()) + " arguments is outside the supported subset");
  }
  for (const auto& [key, value] : args.named) {
    if (std::none_of(names.begin(), names.end(), [&](const char* n) { return key == n; })) {
      fail(line, what + "(" + key + "=...) is outside the supported subset");
    }
  }
}

Json Renderer::sorted_keys(const Json& j) {
  if (j.is_array()) {
    Json out = Json::array();
    for (const auto& item : j) out.push_back(sorted_keys(item));
    return out;
  }
  if (!j.is_object()) return j;
  std::vector<std::string> keys;
  for (const auto& [key, value] : j.items()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  Json out = Json::object();
  for (const auto& key : keys) out[key] = sorted_keys(j[key]);
  return out;
}

}  // namespace fsdp::data::jinja
