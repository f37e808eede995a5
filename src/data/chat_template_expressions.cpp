// Chat templates' expressions, evaluated: literals, names, attributes,
// subscripts and slices (by character, as Python's), and the operators
// with Python's semantics (integers past 64 bits refused).

#include <algorithm>
#include <cmath>

#include "chat_template_renderer.h"
#include "fsdp/data/chat_template.h"

namespace fsdp::data::jinja {

Value Renderer::attribute(const Value& object, const std::string& name, int line) const {
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
Value Renderer::attribute_path(const Value& object, const std::string& path, int line) const {
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

Value Renderer::subscript(const Value& object, const Value& key, int line) const {
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

Value Renderer::slice(const Expr& e) {
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

Json Renderer::number_op(const std::string& op, const Json& a, const Json& b, int line) const {
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

bool Renderer::contains(const Value& container, const Value& item, int line) const {
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

bool Renderer::less(const Json& a, const Json& b, int line) const {
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

Value Renderer::binary(const Expr& e) {
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
    charge(static_cast<int64_t>(x.get_ref<const std::string&>().size() + y.get_ref<const std::string&>().size()),
           e.line);
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
    if (!unit.empty() && times > kMaxRenderBytes / static_cast<int64_t>(unit.size()))
      charge(kMaxRenderBytes + 1, e.line);
    charge(times * static_cast<int64_t>(unit.size()), e.line);
    std::string out;
    out.reserve(static_cast<size_t>(times) * unit.size());
    for (int64_t i = 0; i < times; ++i) out += unit;
    return Value::of(out);
  }
  return Value::of(number_op(op, x, y, e.line));
}

Renderer::Evaluated Renderer::evaluate(const Arguments& args) {
  Evaluated out;
  for (const auto& a : args.positional) out.positional.push_back(eval(*a));
  for (const auto& [key, a] : args.named) out.named[key] = eval(*a);
  return out;
}

Value Renderer::eval(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return Value::of(e.value);
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
    case Expr::Kind::kName:
      return lookup(e.name);
    case Expr::Kind::kAttribute:
      return attribute(eval(*e.operands[0]), e.name, e.line);
    case Expr::Kind::kSubscript:
      return subscript(eval(*e.operands[0]), eval(*e.operands[1]), e.line);
    case Expr::Kind::kSlice:
      return slice(e);
    case Expr::Kind::kCall:
      return call(e);
    case Expr::Kind::kFilter:
      return filter(e);
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
    case Expr::Kind::kBinary:
      return binary(e);
    case Expr::Kind::kTernary:
      if (truthy(eval(*e.operands[0]))) return eval(*e.operands[1]);
      return e.operands.size() > 2 ? eval(*e.operands[2]) : Value::undefined("else");
  }
  fail(e.line, "an expression outside the supported subset");
}

}  // namespace fsdp::data::jinja
