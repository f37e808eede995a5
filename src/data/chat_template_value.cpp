// A chat template's values, as Python sees them: str() and repr(),
// json.dumps as transformers' tojson calls it, the string helpers the
// filters and methods share, and a value's truth, equality, text, length
// and items.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "chat_template_renderer.h"
#include "utf8.h"

namespace fsdp::data::jinja {
namespace {

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

}  // namespace

std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = std::min(utf8_length(static_cast<unsigned char>(s[i])), s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// Python's bool is a number (True == 1): compared and ordered as one.
bool numeric(const Json& j) { return j.is_number() || j.is_boolean(); }
double as_double(const Json& j) { return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>(); }

std::string str(const Json& j) {
  switch (j.type()) {
    case Json::value_t::string:
      return j.get<std::string>();
    case Json::value_t::null:
      return "None";
    case Json::value_t::boolean:
      return j.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer:
      return std::to_string(j.get<int64_t>());
    case Json::value_t::number_unsigned:
      return std::to_string(j.get<uint64_t>());
    case Json::value_t::number_float:
      return python_float(j.get<double>());
    default:
      return repr(j);
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
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
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

const Json& Renderer::data(const Value& v, int line, const std::string& what) const {
  if (v.kind == Value::Kind::kUndefined) fail(line, "'" + v.name + "' is undefined (" + what + ")");
  if (!v.is_data())
    fail(line, "a " + std::string(v.kind == Value::Kind::kNamespace ? "namespace" : "function") + " cannot be " + what);
  return v.data;
}

std::string Renderer::text(const Value& v, int line) const {
  if (!v.defined()) return "";
  return str(data(v, line, "written as text"));
}

bool Renderer::truthy(const Value& v) const {
  if (!v.defined()) return false;
  if (!v.is_data()) return true;
  const Json& j = v.data;
  switch (j.type()) {
    case Json::value_t::null:
      return false;
    case Json::value_t::boolean:
      return j.get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return j.get<int64_t>() != 0;
    case Json::value_t::number_float:
      return j.get<double>() != 0;
    case Json::value_t::string:
      return !j.get<std::string>().empty();
    default:
      return !j.empty();
  }
}

bool Renderer::equal(const Value& a, const Value& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (!a.is_data() || !b.is_data()) return a.ns && a.ns == b.ns;
  // Python: True == 1 and 1 == 1.0.
  if (numeric(a.data) && numeric(b.data)) return as_double(a.data) == as_double(b.data);
  return a.data == b.data;
}

int64_t Renderer::length(const Value& v, int line) const {
  if (!v.defined()) return 0;
  const Json& j = data(v, line, "measured");
  if (j.is_string()) return static_cast<int64_t>(characters(j.get<std::string>()).size());
  if (j.is_array() || j.is_object()) return static_cast<int64_t>(j.size());
  fail(line, "a " + std::string(j.type_name()) + " has no length");
}

// Items to iterate: a list's items, a dict's keys, a string's characters.
Json Renderer::items_of(const Value& v, int line) const {
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

}  // namespace fsdp::data::jinja
