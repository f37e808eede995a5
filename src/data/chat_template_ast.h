#pragma once
// The parsed form of a chat template: what chat_template_parse.cpp builds and
// the renderer (chat_template_renderer.h and its files) walks. Private to them.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

namespace fsdp::data::jinja {

using Json = nlohmann::ordered_json;

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> named;
};

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kList,       // items
    kDict,       // items as key, value pairs (keys[i], items[i])
    kName,       // name
    kAttribute,  // operands[0].name
    kSubscript,  // operands[0][operands[1]]
    kSlice,      // operands[0][a:b:c], absent parts null (has[k])
    kCall,       // operands[0](arguments)
    kFilter,     // operands[0] | name(arguments)
    kTest,       // operands[0] is [not] name(arguments)
    kUnary,      // op operands[0]: "not", "-", "+"
    kBinary,     // operands[0] op operands[1]
    kTernary,    // operands[1] if operands[0] else operands[2] (operands[2] may be absent)
  } kind;
  Json value;
  std::string name, op;
  bool negated = false;  // kTest: "is not"
  std::vector<ExprPtr> operands;
  std::vector<ExprPtr> keys;  // kDict
  std::vector<ExprPtr> items;
  bool has[3] = {false, false, false};  // kSlice: which of start, stop, step are given
  Arguments arguments;
  int line = 0;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (condition or null for else, body)
    kFor,       // for targets in expr [if filter] body [else otherwise]
    kSet,       // set target[.attribute] = expr; targets for unpacking
    kBreak,
    kContinue,
    kGeneration,  // {% generation %}: its body, rendered as is
  } kind;
  std::string text;
  ExprPtr expr, filter;
  std::vector<std::string> targets;
  std::string attribute;  // kSet of a namespace's attribute
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, otherwise;
  int line = 0;
};

struct Template {
  Body body;
};

// Parses SOURCE as Jinja with the settings transformers renders chat
// templates under (trim_blocks, lstrip_blocks). Throws fsdp::Error naming
// the line and the construct for anything outside the subset.
std::unique_ptr<Template> parse(const std::string& source);
// Python's str.isspace for one character: what strip(), split() and the
// '-' of a tag take away.
inline bool is_python_space(UChar32 c) { return u_isUWhiteSpace(c) || (c >= 0x1c && c <= 0x1f); }

// Whether NAME is a test of the subset (`x is NAME`, selectattr's test).
bool is_supported_test(const std::string& name);

}  // namespace fsdp::data::jinja
