#pragma once
// A chat template's runtime values (Value: data, a namespace, a function,
// or undefined) and Python's meaning of them, shared by the renderer's
// files: str() and repr(), json.dumps as transformers' tojson calls it,
// and the string helpers of the filters and methods (chat_template_value.cpp).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chat_template_ast.h"

namespace fsdp::data::jinja {

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

// A string's UTF-8 characters.
std::vector<std::string> characters(const std::string& s);
// Python's bool is a number (True == 1): compared and ordered as one.
bool numeric(const Json& j);
double as_double(const Json& j);
// Python's str() and repr() of a value.
std::string str(const Json& j);
std::string repr(const Json& j);
// Python's json.dumps(x, ensure_ascii=False, indent=indent), as
// transformers' tojson filter calls it.
void dump_json(const Json& j, int indent, int depth, std::string& out);
// Python's str.isspace for one UTF-8 character.
bool python_space(const std::string& c);
// Python's str.upper() and lower() (full case mappings: 'ß'.upper() is 'SS').
std::string change_case(const std::string& s, bool upper);
// Python's title() and capitalize(), a character at a time.
std::string title_case(const std::string& s, bool every_word);
// Python's strip(), lstrip() and rstrip(): CHARS a string, else whitespace.
std::string strip(const std::string& s, const Json& chars, bool left, bool right);
// A Python index: negative ones count from the end of N.
int64_t python_index(int64_t i, int64_t n);

}  // namespace fsdp::data::jinja
