// Chat templates, rendered: the parsed subset walked over JSON values with
// Python's and Jinja's semantics where the supported templates can tell
// (str() of values, slices by characters, undefined values, loop scopes),
// and transformers' globals (raise_exception, strftime_now, its tojson).

#include "fsdp/data/chat_template.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>

#include <unicode/uchar.h>
#include <unicode/locid.h>
#include <unicode/unistr.h>

#include "chat_template_ast.h"
#include "fsdp/common/error.h"
#include "fsdp/io/input_file.h"
#include "utf8.h"

namespace fsdp::data {
namespace jinja {
namespace {

struct Value {
  enum class Kind { kUndefined, kData, kNamespace, kCallable } kind = Kind::kUndefined;
  Json data;
  std::shared_ptr<Json> ns;    // a namespace's attributes
  std::string name;            // the undefined name; a global's or a method's name
  std::shared_ptr<Json> self;  // a method's receiver

  static Value of(Json j) {
    Value v;
    v.kind = Kind::kData;
    v.data = std::move(j);
    return v;
  }
  static Value undefined(std::string name) {
    Value v;
    v.name = std::move(name);
    return v;
  }
  static Value callable(std::string name, std::shared_ptr<Json> self = nullptr) {
    Value v;
    v.kind = Kind::kCallable;
    v.name = std::move(name);
    v.self = std::move(self);
    return v;
  }
  bool defined() const { return kind != Kind::kUndefined; }
  bool is_data() const { return kind == Kind::kData; }
};

enum class Flow { kNormal, kBreak, kContinue };

std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = std::min(utf8_length(static_cast<unsigned char>(s[i])), s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string python_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == std::floor(d) && std::fabs(d) < 1e16) {
    char text[40];
    std::snprintf(text, sizeof(text), "%.1f", d);
    return text;
  }
  for (int precision = 1; precision <= 17; ++precision) {
    char text[40];
    std::snprintf(text, sizeof(text), "%.*g", precision, d);
    if (std::strtod(text, nullptr) == d) {
      std::string s = text;
      // Python writes exponents with at least two digits: 1e+20, 1e-05.
      return s;
    }
  }
  return std::to_string(d);
}

std::string repr(const Json& j);

// Python's bool is a number (True == 1): compared and ordered as one.
bool numeric(const Json& j) { return j.is_number() || j.is_boolean(); }
double as_double(const Json& j) { return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>(); }

std::string str(const Json& j) {
  switch (j.type()) {
    case Json::value_t::string: return j.get<std::string>();
    case Json::value_t::null: return "None";
    case Json::value_t::boolean: return j.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer: return std::to_string(j.get<int64_t>());
    case Json::value_t::number_unsigned: return std::to_string(j.get<uint64_t>());
    case Json::value_t::number_float: return python_float(j.get<double>());
    default: return repr(j);
  }
}

std::string repr(const Json& j) {
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    const char quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    std::string out(1, quote);
    for (const char c : s) {
      if (c == '\\') {
        out += "\\\\";
      } else if (c == quote) {
        out += std::string("\\") + c;
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c == '\r') {
        out += "\\r";
      } else {
        out += c;
      }
    }
    return out + quote;
  }
  if (j.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + repr(j[i]);
    return out + "]";
  }
  if (j.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [key, value] : j.items()) {
      out += (first ? "" : ", ") + repr(Json(key)) + ": " + repr(value);
      first = false;
    }
    return out + "}";
  }
  return str(j);
}

// Python's json.dumps(x, ensure_ascii=False, indent=indent), as
// transformers' tojson filter calls it.
void dump_json(const Json& j, int indent, int depth, std::string& out) {
  const auto newline = [&](int level) {
    out += '\n';
    out.append(static_cast<size_t>(indent * level), ' ');
  };
  if (j.is_object() || j.is_array()) {
    const bool object = j.is_object();
    if (j.empty()) {
      out += object ? "{}" : "[]";
      return;
    }
    out += object ? '{' : '[';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) out += indent >= 0 ? "," : ", ";
      first = false;
      if (indent >= 0) newline(depth + 1);
      if (object) {
        dump_json(Json(it.key()), indent, depth + 1, out);
        out += ": ";
      }
      dump_json(*it, indent, depth + 1, out);
    }
    if (indent >= 0) newline(depth);
    out += object ? '}' : ']';
    return;
  }
  if (j.is_string()) {
    out += '"';
    for (const char c : j.get<std::string>()) {
      const auto u = static_cast<unsigned char>(c);
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (u < 0x20) {
            char text[8];
            std::snprintf(text, sizeof(text), "\\u%04x", u);
            out += text;
          } else {
            out += c;
          }
      }
    }
    out += '"';
    return;
  }
  if (j.is_null()) {
    out += "null";
  } else if (j.is_boolean()) {
    out += j.get<bool>() ? "true" : "false";
  } else if (j.is_number_float()) {
    const double d = j.get<double>();
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : python_float(d);
  } else {
    out += j.dump();
  }
}

// Python's str.isspace for one UTF-8 character.
bool python_space(const std::string& c) {
  int32_t i = 0;
  UChar32 u;
  U8_NEXT(reinterpret_cast<const uint8_t*>(c.data()), i, static_cast<int32_t>(c.size()), u);
  return u >= 0 && is_python_space(u);
}

// Python's str.upper() and lower() (full case mappings: 'ß'.upper() is 'SS').
std::string change_case(const std::string& s, bool upper) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
  if (upper) {
    u.toUpper(icu::Locale::getRoot());
  } else {
    u.toLower(icu::Locale::getRoot());
  }
  std::string out;
  return u.toUTF8String(out);
}

// Python's title() and capitalize(), a character at a time.
std::string title_case(const std::string& s, bool every_word) {
  std::string out;
  bool word_start = true, first = true;
  for (const auto& c : characters(s)) {
    int32_t i = 0;
    UChar32 u;
    U8_NEXT(reinterpret_cast<const uint8_t*>(c.data()), i, static_cast<int32_t>(c.size()), u);
    if (u < 0) {
      out += c;
      continue;
    }
    const bool up = every_word ? word_start : first;
    const UChar32 mapped = up ? u_totitle(u) : u_tolower(u);
    char bytes[4];
    int32_t n = 0;
    U8_APPEND_UNSAFE(reinterpret_cast<uint8_t*>(bytes), n, mapped);
    out.append(bytes, static_cast<size_t>(n));
    word_start = !u_isalpha(u);
    first = false;
  }
  return out;
}

std::string strip(const std::string& s, const Json& chars, bool left, bool right) {
  auto cs = characters(s);
  const auto set = chars.is_string() ? characters(chars.get<std::string>()) : std::vector<std::string>{};
  const auto drop = [&](const std::string& c) {
    return chars.is_string() ? std::find(set.begin(), set.end(), c) != set.end() : python_space(c);
  };
  size_t begin = 0, end = cs.size();
  while (left && begin < end && drop(cs[begin])) ++begin;
  while (right && end > begin && drop(cs[end - 1])) --end;
  std::string out;
  for (size_t i = begin; i < end; ++i) out += cs[i];
  return out;
}

int64_t python_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

class Renderer {
 public:
  Renderer(const Json& context, std::string& out) : out_(out) {
    frames_.emplace_back();
    for (const auto& [key, value] : context.items()) frames_.back()[key] = Value::of(value);
    for (const char* global : {"raise_exception", "strftime_now", "namespace", "range", "dict"}) {
      if (!frames_.back().count(global)) frames_.back()[global] = Value::callable(global);
    }
  }

  Flow body(const Body& nodes) {
    for (const auto& node : nodes) {
      const Flow flow = run(*node);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const {
    throw Error("chat template line " + std::to_string(line) + ": " + what);
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
  void charge(int64_t bytes, int line) {
    produced_ += bytes;
    if (produced_ > kMaxRenderBytes) {
      fail(line, "the render makes more than " + std::to_string(kMaxRenderBytes >> 20) +
                     " MiB of strings and lists (a template that repeats or doubles them without bound); refused");
    }
  }
  void charge_items(size_t n, int line) { charge(static_cast<int64_t>(n) * 16, line); }
  void count_iteration(int line) {
    if (++iterations_ > kMaxLoopIterations) {
      fail(line, "the render's loops run more than " + std::to_string(kMaxLoopIterations) +
                     " iterations (nested loops over large ranges); refused");
    }
  }
  // Refuses `j` (about to go inside a new list or dict) when it nests
  // kMaxValueNesting deep already; visits no deeper than that.
  void check_nesting(const Json& j, int line) const {
    if (nesting(j, kMaxValueNesting) >= kMaxValueNesting) {
      fail(line, "a list or dict nests deeper than " + std::to_string(kMaxValueNesting) + " levels; refused");
    }
  }
  static int nesting(const Json& j, int limit) {
    if (!j.is_array() && !j.is_object()) return 0;
    if (limit <= 0) return 1;
    int deepest = 0;
    for (const auto& item : j) {
      if (item.is_array() || item.is_object()) deepest = std::max(deepest, nesting(item, limit - 1));
      if (deepest >= limit) break;
    }
    return deepest + 1;
  }
  Value made(std::string s, int line) {
    charge(static_cast<int64_t>(s.size()), line);
    return Value::of(std::move(s));
  }
  Value made(Json j, int line) {
    if (j.is_string()) {
      charge(static_cast<int64_t>(j.get_ref<const std::string&>().size()), line);
    } else if (j.is_array() || j.is_object()) {
      charge_items(j.size(), line);
    }
    return Value::of(std::move(j));
  }

  int64_t produced_ = 0;
  int64_t iterations_ = 0;

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      if (auto found = it->find(name); found != it->end()) return found->second;
    }
    return Value::undefined(name);
  }

  const Json& data(const Value& v, int line, const std::string& what) const {
    if (v.kind == Value::Kind::kUndefined) fail(line, "'" + v.name + "' is undefined (" + what + ")");
    if (!v.is_data()) fail(line, "a " + std::string(v.kind == Value::Kind::kNamespace ? "namespace" : "function") +
                                     " cannot be " + what);
    return v.data;
  }

  std::string text(const Value& v, int line) const {
    if (!v.defined()) return "";
    return str(data(v, line, "written as text"));
  }

  bool truthy(const Value& v) const {
    if (!v.defined()) return false;
    if (!v.is_data()) return true;
    const Json& j = v.data;
    switch (j.type()) {
      case Json::value_t::null: return false;
      case Json::value_t::boolean: return j.get<bool>();
      case Json::value_t::number_integer:
      case Json::value_t::number_unsigned: return j.get<int64_t>() != 0;
      case Json::value_t::number_float: return j.get<double>() != 0;
      case Json::value_t::string: return !j.get<std::string>().empty();
      default: return !j.empty();
    }
  }

  static bool equal(const Value& a, const Value& b) {
    if (!a.defined() || !b.defined()) return a.defined() == b.defined();
    if (!a.is_data() || !b.is_data()) return a.ns && a.ns == b.ns;
    // Python: True == 1 and 1 == 1.0.
    if (numeric(a.data) && numeric(b.data)) return as_double(a.data) == as_double(b.data);
    return a.data == b.data;
  }

  int64_t length(const Value& v, int line) const {
    if (!v.defined()) return 0;
    const Json& j = data(v, line, "measured");
    if (j.is_string()) return static_cast<int64_t>(characters(j.get<std::string>()).size());
    if (j.is_array() || j.is_object()) return static_cast<int64_t>(j.size());
    fail(line, "a " + std::string(j.type_name()) + " has no length");
  }

  // Items to iterate: a list's items, a dict's keys, a string's characters.
  Json items_of(const Value& v, int line) const {
    if (!v.defined()) return Json::array();
    const Json& j = data(v, line, "iterated");
    if (j.is_array()) return j;
    Json out = Json::array();
    if (j.is_object()) {
      for (const auto& [key, value] : j.items()) out.push_back(key);
    } else if (j.is_string()) {
      for (auto& c : characters(j.get<std::string>())) out.push_back(c);
    } else {
      fail(line, "a " + std::string(j.type_name()) + " cannot be iterated");
    }
    return out;
  }

  Value attribute(const Value& object, const std::string& name, int line) const {
    if (object.kind == Value::Kind::kNamespace) {
      return object.ns->contains(name) ? Value::of((*object.ns)[name]) : Value::undefined(name);
    }
    const Json& j = data(object, line, "asked for '" + name + "'");
    static const char* kStringMethods[] = {"strip", "lstrip", "rstrip",  "split", "startswith", "endswith",
                                           "upper", "lower",  "replace", "title", "capitalize"};
    static const char* kDictMethods[] = {"items", "keys", "values", "get"};
    if (j.is_string()) {
      for (const char* m : kStringMethods) {
        if (name == m) return Value::callable(name, std::make_shared<Json>(j));
      }
    }
    if (j.is_object()) {
      for (const char* m : kDictMethods) {
        if (name == m) return Value::callable(name, std::make_shared<Json>(j));
      }
      return j.contains(name) ? Value::of(j[name]) : Value::undefined(name);
    }
    if ((j.is_array() || j.is_string()) && !name.empty() && name.size() < 10 &&
        std::all_of(name.begin(), name.end(), ::isdigit)) {
      return subscript(object, Value::of(static_cast<int64_t>(std::stoll(name))), line);  // x.0 is x[0]
    }
    return Value::undefined(name);
  }

  // Jinja's attribute getter of map and selectattr: "a.b.0" follows each
  // part, a number an index.
  Value attribute_path(const Value& object, const std::string& path, int line) const {
    Value v = object;
    size_t start = 0;
    for (;;) {
      const size_t dot = path.find('.', start);
      const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (!v.defined()) return v;
      const bool index = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
      v = index && v.is_data() && v.data.is_array() ? subscript(v, Value::of(std::stoll(part)), line)
                                                     : attribute(v, part, line);
      if (dot == std::string::npos) return v;
      start = dot + 1;
    }
  }

  Value subscript(const Value& object, const Value& key, int line) const {
    const Json& j = data(object, line, "subscripted");
    const Json& k = data(key, line, "a subscript");
    if (j.is_object()) {
      if (!k.is_string()) return Value::undefined(str(k));
      return j.contains(k.get<std::string>()) ? Value::of(j[k.get<std::string>()]) : Value::undefined(str(k));
    }
    if (k.is_string()) return attribute(object, k.get<std::string>(), line);
    if (k.is_boolean()) return subscript(object, Value::of(k.get<bool>() ? 1 : 0), line);
    if (!k.is_number_integer()) fail(line, "a " + std::string(j.type_name()) + " is subscripted by a " + k.type_name());
    if (j.is_array()) {
      const int64_t i = python_index(k.get<int64_t>(), static_cast<int64_t>(j.size()));
      return i >= 0 && i < static_cast<int64_t>(j.size()) ? Value::of(j[static_cast<size_t>(i)])
                                                           : Value::undefined(str(k));
    }
    if (j.is_string()) {
      const auto cs = characters(j.get<std::string>());
      const int64_t i = python_index(k.get<int64_t>(), static_cast<int64_t>(cs.size()));
      return i >= 0 && i < static_cast<int64_t>(cs.size()) ? Value::of(cs[static_cast<size_t>(i)])
                                                            : Value::undefined(str(k));
    }
    fail(line, "a " + std::string(j.type_name()) + " cannot be subscripted");
  }

  Value slice(const Expr& e) {
    const Value object = eval(*e.operands[0]);
    const Json& j = data(object, e.line, "sliced");
    int64_t bound[3] = {0, 0, 1};
    bool has[3] = {e.has[0], e.has[1], e.has[2]};
    for (int k = 0; k < 3; ++k) {
      if (!has[k]) continue;
      const Json b = data(eval(*e.operands[1 + static_cast<size_t>(k)]), e.line, "a slice bound");
      if (b.is_null()) {
        has[k] = false;
        continue;
      }
      if (!b.is_number_integer()) fail(e.line, "a slice bound must be an integer");
      bound[k] = b.get<int64_t>();
    }
    const int64_t step = has[2] ? bound[2] : 1;
    if (step == 0) fail(e.line, "a slice step of 0");
    std::vector<Json> parts;
    if (j.is_array()) {
      for (const auto& item : j) parts.push_back(item);
    } else if (j.is_string()) {
      for (auto& c : characters(j.get<std::string>())) parts.push_back(c);
    } else {
      fail(e.line, "a " + std::string(j.type_name()) + " cannot be sliced");
    }
    const auto n = static_cast<int64_t>(parts.size());
    // Python's slice.indices.
    const auto clamp = [&](int64_t v, bool given, int64_t fallback) {
      if (!given) return fallback;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = clamp(bound[0], has[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(bound[1], has[1], step > 0 ? n : -1);
    std::vector<Json> picked;
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      picked.push_back(parts[static_cast<size_t>(i)]);
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    if (j.is_string()) {
      std::string s;
      for (auto& c : picked) s += c.get<std::string>();
      return Value::of(s);
    }
    return Value::of(Json(picked));
  }

  Json number_op(const std::string& op, const Json& a, const Json& b, int line) const {
    if (!a.is_number() || !b.is_number() || a.is_boolean() || b.is_boolean()) {
      fail(line, "'" + op + "' of a " + a.type_name() + " and a " + b.type_name());
    }
    const bool ints = a.is_number_integer() && b.is_number_integer();
    if (ints && op != "/" && !(op == "**" && b.get<int64_t>() < 0)) {
      const int64_t x = a.get<int64_t>(), y = b.get<int64_t>();
      if ((op == "//" || op == "%") && y == 0) fail(line, "division by zero");
      // Python's integers have no bound; a template's past 64 bits is refused.
      const auto too_big = [&] { fail(line, "'" + op + "' of " + str(a) + " and " + str(b) + " is past 64 bits"); };
      int64_t r = 0;
      if (op == "+") return __builtin_add_overflow(x, y, &r) ? (too_big(), r) : r;
      if (op == "-") return __builtin_sub_overflow(x, y, &r) ? (too_big(), r) : r;
      if (op == "*") return __builtin_mul_overflow(x, y, &r) ? (too_big(), r) : r;
      if (y == -1 && (op == "//" || op == "%")) {
        if (op == "%") return int64_t{0};
        return __builtin_sub_overflow(int64_t{0}, x, &r) ? (too_big(), r) : r;
      }
      if (op == "//") return x / y - ((x % y != 0) && ((x < 0) != (y < 0)) ? 1 : 0);
      if (op == "%") return ((x % y) + y) % y;
      // x ** y, y >= 0, by squaring.
      int64_t base = x, e = y;
      r = 1;
      while (e > 0) {
        if ((e & 1) && __builtin_mul_overflow(r, base, &r)) too_big();
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) too_big();
      }
      return r;
    }
    const double x = a.get<double>(), y = b.get<double>();
    if ((op == "/" || op == "//" || op == "%") && y == 0) fail(line, "division by zero");
    if (op == "+") return x + y;
    if (op == "-") return x - y;
    if (op == "*") return x * y;
    if (op == "/") return x / y;
    if (op == "//") return std::floor(x / y);
    if (op == "%") return x - y * std::floor(x / y);
    return std::pow(x, y);
  }

  bool contains(const Value& container, const Value& item, int line) const {
    if (!container.defined()) return false;
    const Json& c = data(container, line, "searched with 'in'");
    if (c.is_string()) {
      const Json& i = data(item, line, "searched for in a string");
      if (!i.is_string()) fail(line, "'in <string>' needs a string on the left, not a " + std::string(i.type_name()));
      return c.get<std::string>().find(i.get<std::string>()) != std::string::npos;
    }
    if (c.is_object()) return item.is_data() && item.data.is_string() && c.contains(item.data.get<std::string>());
    if (c.is_array()) {
      for (const auto& x : c) {
        if (equal(Value::of(x), item)) return true;
      }
      return false;
    }
    fail(line, "a " + std::string(c.type_name()) + " cannot be searched with 'in'");
  }

  bool less(const Json& a, const Json& b, int line) const {
    if (numeric(a) && numeric(b)) return as_double(a) < as_double(b);
    if (a.is_string() && b.is_string()) return a.get<std::string>() < b.get<std::string>();
    if (a.is_array() && b.is_array()) {  // lexicographic, as Python's lists
      for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        if (!equal(Value::of(a[i]), Value::of(b[i]))) return less(a[i], b[i], line);
      }
      return a.size() < b.size();
    }
    fail(line, "a " + std::string(a.type_name()) + " and a " + b.type_name() + " cannot be ordered");
  }

  Value binary(const Expr& e) {
    const std::string& op = e.op;
    if (op == "and") {
      Value a = eval(*e.operands[0]);
      return truthy(a) ? eval(*e.operands[1]) : a;
    }
    if (op == "or") {
      Value a = eval(*e.operands[0]);
      return truthy(a) ? a : eval(*e.operands[1]);
    }
    const Value a = eval(*e.operands[0]), b = eval(*e.operands[1]);
    if (op == "==") return Value::of(equal(a, b));
    if (op == "!=") return Value::of(!equal(a, b));
    if (op == "in") return Value::of(contains(b, a, e.line));
    if (op == "not in") return Value::of(!contains(b, a, e.line));
    if (op == "~") {
      std::string left = text(a, e.line);
      const std::string right = text(b, e.line);
      charge(static_cast<int64_t>(left.size() + right.size()), e.line);
      return Value::of(left.append(right));
    }
    const Json& x = data(a, e.line, "an operand of '" + op + "'");
    const Json& y = data(b, e.line, "an operand of '" + op + "'");
    if (op == "<") return Value::of(less(x, y, e.line));
    if (op == ">") return Value::of(less(y, x, e.line));
    if (op == "<=") return Value::of(!less(y, x, e.line));
    if (op == ">=") return Value::of(!less(x, y, e.line));
    if (op == "+" && x.is_string() && y.is_string()) {
      charge(static_cast<int64_t>(x.get_ref<const std::string&>().size() + y.get_ref<const std::string&>().size()), e.line);
      return Value::of(x.get<std::string>() + y.get<std::string>());
    }
    if (op == "+" && x.is_array() && y.is_array()) {
      charge_items(x.size() + y.size(), e.line);
      Json out = x;
      for (const auto& item : y) out.push_back(item);
      return Value::of(out);
    }
    if (op == "*" && x.is_string() && y.is_number_integer()) {
      const auto& unit = x.get_ref<const std::string&>();
      const int64_t times = std::max<int64_t>(y.get<int64_t>(), 0);
      // The product's size, checked before it is built (and before it overflows).
      if (!unit.empty() && times > kMaxRenderBytes / static_cast<int64_t>(unit.size())) charge(kMaxRenderBytes + 1, e.line);
      charge(times * static_cast<int64_t>(unit.size()), e.line);
      std::string out;
      out.reserve(static_cast<size_t>(times) * unit.size());
      for (int64_t i = 0; i < times; ++i) out += unit;
      return Value::of(out);
    }
    return Value::of(number_op(op, x, y, e.line));
  }

  bool test(const std::string& name, const Value& v, const std::vector<Value>& args, int line) const {
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

  struct Evaluated {
    std::vector<Value> positional;
    std::map<std::string, Value> named;
    const Value& at(size_t i, const std::string& key, int line, const std::string& what) const {
      if (i < positional.size()) return positional[i];
      if (auto it = named.find(key); it != named.end()) return it->second;
      throw Error("chat template line " + std::to_string(line) + ": " + what + " needs the argument '" + key + "'");
    }
    const Value* maybe(size_t i, const std::string& key) const {
      if (i < positional.size()) return &positional[i];
      if (auto it = named.find(key); it != named.end()) return &it->second;
      return nullptr;
    }
  };

  Evaluated evaluate(const Arguments& args) {
    Evaluated out;
    for (const auto& a : args.positional) out.positional.push_back(eval(*a));
    for (const auto& [key, a] : args.named) out.named[key] = eval(*a);
    return out;
  }

  Value filter(const Expr& e) {
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
  static int64_t replaced_size(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
    if (from.empty()) return static_cast<int64_t>(s.size());
    int64_t n = 0;
    for (size_t at = s.find(from); at != std::string::npos && (count < 0 || n < count); at = s.find(from, at + from.size())) ++n;
    return static_cast<int64_t>(s.size()) + n * (static_cast<int64_t>(to.size()) - static_cast<int64_t>(from.size()));
  }

  // Python's str.replace (count < 0: every occurrence).
  static std::string replace_all(std::string s, const std::string& from, const std::string& to, int64_t count = -1) {
    if (from.empty()) {
      if (count != 0 && !to.empty()) throw Error("chat template: replace of an empty string is outside the supported subset");
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
  void only(const Evaluated& args, size_t most, std::initializer_list<const char*> names, int line,
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

  static Json sorted_keys(const Json& j) {
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

  Value call(const Expr& e) {
    const Value f = eval(*e.operands[0]);
    const int line = e.line;
    if (f.kind != Value::Kind::kCallable) {
      fail(line, (f.defined() ? std::string("a value") : "'" + f.name + "'") + " is not a function in the supported subset");
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

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return Value::of(e.value);
      case Expr::Kind::kList: {
        Json out = Json::array();
        charge_items(e.items.size(), e.line);
        for (const auto& item : e.items) {
          out.push_back(data(eval(*item), e.line, "put in a list"));
          check_nesting(out.back(), e.line);
        }
        return Value::of(out);
      }
      case Expr::Kind::kDict: {
        Json out = Json::object();
        charge_items(e.items.size(), e.line);
        for (size_t i = 0; i < e.items.size(); ++i) {
          Json& slot = out[text(eval(*e.keys[i]), e.line)];
          slot = data(eval(*e.items[i]), e.line, "put in a dict");
          check_nesting(slot, e.line);
        }
        return Value::of(out);
      }
      case Expr::Kind::kName: return lookup(e.name);
      case Expr::Kind::kAttribute: return attribute(eval(*e.operands[0]), e.name, e.line);
      case Expr::Kind::kSubscript: return subscript(eval(*e.operands[0]), eval(*e.operands[1]), e.line);
      case Expr::Kind::kSlice: return slice(e);
      case Expr::Kind::kCall: return call(e);
      case Expr::Kind::kFilter: return filter(e);
      case Expr::Kind::kTest: {
        const Value v = eval(*e.operands[0]);
        const Evaluated args = evaluate(e.arguments);
        return Value::of(test(e.name, v, args.positional, e.line) != e.negated);
      }
      case Expr::Kind::kUnary: {
        const Value v = eval(*e.operands[0]);
        if (e.op == "not") return Value::of(!truthy(v));
        const Json& j = data(v, e.line, "negated");
        if (e.op == "+") return Value::of(j);
        return Value::of(number_op("-", Json(0), j, e.line));
      }
      case Expr::Kind::kBinary: return binary(e);
      case Expr::Kind::kTernary:
        if (truthy(eval(*e.operands[0]))) return eval(*e.operands[1]);
        return e.operands.size() > 2 ? eval(*e.operands[2]) : Value::undefined("else");
    }
    fail(e.line, "an expression outside the supported subset");
  }

  void assign(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      frames_.back()[targets[0]] = v;
      return;
    }
    const Json& j = data(v, line, "unpacked");
    if (!j.is_array() || j.size() != targets.size()) {
      fail(line, "cannot unpack " + repr(j) + " into " + std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < targets.size(); ++i) frames_.back()[targets[i]] = Value::of(j[i]);
  }

  Flow loop(const Node& node) {
    const Json all = items_of(eval(*node.expr), node.line);
    std::vector<Json> items;
    for (const auto& item : all) {
      count_iteration(node.line);
      if (node.filter) {
        frames_.emplace_back();
        assign(node.targets, Value::of(item), node.line);
        const bool keep = truthy(eval(*node.filter));
        frames_.pop_back();
        if (!keep) continue;
      }
      items.push_back(item);
    }
    if (items.empty()) return body(node.otherwise);
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      if (!node.filter) count_iteration(node.line);  // a filtered loop counted its items above
      frames_.emplace_back();
      Json loop = {{"index0", i},         {"index", i + 1},         {"first", i == 0}, {"last", i == n - 1},
                   {"length", n},         {"revindex", n - i},      {"revindex0", n - i - 1}};
      if (i > 0) loop["previtem"] = items[static_cast<size_t>(i - 1)];
      if (i + 1 < n) loop["nextitem"] = items[static_cast<size_t>(i + 1)];
      frames_.back()["loop"] = Value::of(loop);
      assign(node.targets, Value::of(items[static_cast<size_t>(i)]), node.line);
      const Flow flow = body(node.body);
      frames_.pop_back();
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Flow run(const Node& node) {
    switch (node.kind) {
      case Node::Kind::kText:
        charge(static_cast<int64_t>(node.text.size()), node.line);
        out_ += node.text;
        return Flow::kNormal;
      case Node::Kind::kOutput: {
        const std::string piece = text(eval(*node.expr), node.line);
        charge(static_cast<int64_t>(piece.size()), node.line);
        out_ += piece;
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (const auto& [condition, branch] : node.branches) {
          if (!condition || truthy(eval(*condition))) return body(branch);
        }
        return Flow::kNormal;
      case Node::Kind::kFor: return loop(node);
      case Node::Kind::kSet: {
        const Value v = eval(*node.expr);
        if (node.attribute.empty()) {
          assign(node.targets, v, node.line);
          return Flow::kNormal;
        }
        const Value ns = lookup(node.targets[0]);
        if (ns.kind != Value::Kind::kNamespace) {
          fail(node.line, "'" + node.targets[0] + "." + node.attribute + "' is set, but '" + node.targets[0] +
                              "' is no namespace()");
        }
        (*ns.ns)[node.attribute] = data(v, node.line, "a namespace's attribute");
        return Flow::kNormal;
      }
      case Node::Kind::kBreak: return Flow::kBreak;
      case Node::Kind::kContinue: return Flow::kContinue;
      case Node::Kind::kGeneration: return body(node.body);
    }
    return Flow::kNormal;
  }

  std::vector<std::map<std::string, Value>> frames_;
  std::string& out_;
};

}  // namespace
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
    FSDP_CHECK(ec || static_cast<int64_t>(size) <= kMaxTemplateBytes, "chat template '", jinja_file.string(), "': ",
               size, " bytes; a template is at most ", kMaxTemplateBytes >> 20, " MiB (real ones are a few KB); refused");
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
