#pragma once
// The renderer of chat templates, private to its files: one Renderer walks
// a parsed template (chat_template_ast.h) over a context's values. Its
// members are defined by what they render, as template engines lay
// themselves out:
//   chat_template_render.cpp       ChatTemplate, the renderer's frames and
//                                  its bounds ([Note: a template's bounds])
//   chat_template_value.cpp        a value's truth, equality, text, length
//                                  and items (with chat_template_value.h)
//   chat_template_expressions.cpp  expressions: names, attributes,
//                                  subscripts, slices, operators
//   chat_template_statements.cpp   statements: text, output, if, for, set,
//                                  break, continue, generation
//   chat_template_filters.cpp      filters and tests
//   chat_template_calls.cpp        calls: the globals (raise_exception,
//                                  strftime_now, namespace, dict, range)
//                                  and Python's string and dict methods

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "chat_template_ast.h"
#include "chat_template_value.h"
#include "fsdp/common/error.h"

namespace fsdp::data::jinja {

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const Json& context, std::string& out);

  // Renders NODES in order; a break or continue ends them early.
  Flow body(const Body& nodes);

 private:
  [[noreturn]] void fail(int line, const std::string& what) const {
    throw Error("chat template line " + std::to_string(line) + ": " + what);
  }

  // The bounds (chat_template_render.cpp).
  void charge(int64_t bytes, int line);
  void charge_items(size_t n, int line);
  void count_iteration(int line);
  void check_nesting(const Json& j, int line) const;
  static int nesting(const Json& j, int limit);
  Value made(std::string s, int line);
  Value made(Json j, int line);

  int64_t produced_ = 0;
  int64_t iterations_ = 0;

  // Values (chat_template_value.cpp).
  const Json& data(const Value& v, int line, const std::string& what) const;
  std::string text(const Value& v, int line) const;
  bool truthy(const Value& v) const;
  static bool equal(const Value& a, const Value& b);
  int64_t length(const Value& v, int line) const;
  Json items_of(const Value& v, int line) const;

  // Expressions (chat_template_expressions.cpp).
  Value attribute(const Value& object, const std::string& name, int line) const;
  Value attribute_path(const Value& object, const std::string& path, int line) const;
  Value subscript(const Value& object, const Value& key, int line) const;
  Value slice(const Expr& e);
  Json number_op(const std::string& op, const Json& a, const Json& b, int line) const;
  bool contains(const Value& container, const Value& item, int line) const;
  bool less(const Json& a, const Json& b, int line) const;
  Value binary(const Expr& e);
  Value eval(const Expr& e);

  // A call's, a filter's or a test's arguments, evaluated.
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

  Evaluated evaluate(const Arguments& args);

  // Filters and tests (chat_template_filters.cpp).
  bool test(const std::string& name, const Value& v, const std::vector<Value>& args, int line) const;
  Value filter(const Expr& e);
  static int64_t replaced_size(const std::string& s, const std::string& from, const std::string& to, int64_t count);
  static std::string replace_all(std::string s, const std::string& from, const std::string& to, int64_t count = -1);
  void only(const Evaluated& args, size_t most, std::initializer_list<const char*> names, int line,
            const std::string& what) const;
  static Json sorted_keys(const Json& j);

  // Globals and methods (chat_template_calls.cpp).
  Value call(const Expr& e);

  // Statements and their scopes (chat_template_statements.cpp).
  Value lookup(const std::string& name) const;
  void assign(const std::vector<std::string>& targets, const Value& v, int line);
  Flow loop(const Node& node);
  Flow run(const Node& node);

  std::vector<std::map<std::string, Value>> frames_;
  std::string& out_;
};

}  // namespace fsdp::data::jinja
