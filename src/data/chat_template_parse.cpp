// Chat templates, parsed: the Jinja subset the supported families' templates
// use, read as transformers reads them (trim_blocks, lstrip_blocks, no
// trailing newline kept). Whatever lies outside the subset is refused here,
// naming the line, so that no template is ever rendered approximately.

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include "chat_template_ast.h"
#include "fsdp/common/error.h"

namespace fsdp::data::jinja {
namespace {

const std::set<std::string> kFilters = {
    "trim",    "length", "count",  "tojson", "string", "list",  "selectattr", "rejectattr", "first", "last",
    "join",    "default", "d",     "upper",  "lower",  "capitalize", "replace", "reverse", "int", "abs",
    "items",   "safe",   "map",    "unique", "float"};
const std::set<std::string> kTests = {
    "defined", "undefined", "none",   "string", "number", "integer", "float", "boolean", "mapping",
    "iterable", "sequence", "true",   "false",  "equalto", "eq",     "==",    "ne",      "!=",
    "odd",     "even",      "divisibleby", "in",  "lt",    "gt",    "le",      "ge"};

// Deeper than any real template nests (expressions, blocks).
constexpr int kMaxNesting = 100;

// Python's str.lstrip() / rstrip() with no argument: Unicode whitespace.
std::string strip_python_space(const std::string& s, bool left, bool right) {
  int32_t begin = 0, end = static_cast<int32_t>(s.size());
  const auto* bytes = reinterpret_cast<const uint8_t*>(s.data());
  while (left && begin < end) {
    int32_t next = begin;
    UChar32 c;
    U8_NEXT(bytes, next, end, c);
    if (!is_python_space(c)) break;
    begin = next;
  }
  while (right && end > begin) {
    int32_t prev = end;
    UChar32 c;
    U8_PREV(bytes, begin, prev, c);
    if (!is_python_space(c)) break;
    end = prev;
  }
  return s.substr(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
}

// ---- segments: text and tags, whitespace control applied ----------------

struct Segment {
  enum class Kind { kText, kOutput, kStatement } kind;
  std::string text;  // the text, or the tag's inside
  int line;
};

// Line numbers of positions, counted once (a template of many lines must
// not cost a rescan per tag).
class Lines {
 public:
  explicit Lines(const std::string& s) {
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n') starts_.push_back(i + 1);
    }
  }
  int at(size_t pos) const {
    return static_cast<int>(std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin());
  }
  // Where the line holding `pos` starts.
  size_t start_of_line(size_t pos) const { return starts_[static_cast<size_t>(at(pos) - 1)]; }

 private:
  std::vector<size_t> starts_{0};
};

bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// The end of the tag opened at `from` (the position after its opener):
// where `closer` starts outside every string literal and bracket, as
// Jinja's lexer balances them ({{ {'a': {'b': 1}} }}).
size_t tag_end(const std::string& s, size_t from, const std::string& closer, int line) {
  char quote = 0;
  int depth = 0;
  for (size_t i = from; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (depth == 0 && s.compare(i, closer.size(), closer) == 0) {
      return i;
    } else if (c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if ((c == ')' || c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  throw Error("chat template line " + std::to_string(line) + ": a tag opened here is never closed with '" + closer + "'");
}

std::vector<Segment> segments_of(std::string source) {
  // Jinja reads \r\n and \r as \n; keep_trailing_newline=False: one
  // newline at the end goes.
  std::string s;
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s += source[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  const Lines lines(s);
  const auto line_at = [&](const std::string&, size_t pos) { return lines.at(pos); };
  std::vector<Segment> out;
  std::string text;
  bool strip_leading = false;  // a '-' closed the last tag
  size_t pos = 0;
  auto flush = [&](int line) {
    if (!text.empty()) out.push_back({Segment::Kind::kText, text, line});
    text.clear();
  };
  while (pos <= s.size()) {
    size_t open = s.find('{', pos);
    while (open != std::string::npos && open + 1 < s.size() && s[open + 1] != '{' && s[open + 1] != '%' &&
           s[open + 1] != '#') {
      open = s.find('{', open + 1);
    }
    if (open == std::string::npos || open + 1 >= s.size()) open = s.size();
    std::string chunk = s.substr(pos, open - pos);
    if (strip_leading) {
      chunk = strip_python_space(chunk, true, false);
      strip_leading = false;
    }
    if (open == s.size()) {
      text += chunk;
      flush(line_at(s, pos));
      break;
    }
    const char kind = s[open + 1];
    const char modifier = open + 2 < s.size() ? s[open + 2] : 0;
    const int line = line_at(s, open);
    if (modifier == '-') {
      chunk = strip_python_space(chunk, false, true);
    } else if (kind != '{' && modifier != '+') {
      // lstrip_blocks: spaces and tabs between the start of the line (in
      // the source) and a block or comment tag go.
      // From the tag back to the first other character: a template of many
      // tags on one line must not cost a rescan of the line per tag.
      const size_t line_start = lines.start_of_line(open);
      size_t i = open;
      while (i > line_start && (s[i - 1] == ' ' || s[i - 1] == '\t')) --i;
      const bool blank = i == line_start;
      if (blank && open - line_start <= chunk.size()) chunk.erase(chunk.size() - (open - line_start));
    }
    text += chunk;
    const size_t inner = open + 2 + (modifier == '-' || modifier == '+' ? 1 : 0);
    const std::string closer = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t close = kind == '#' ? s.find("#}", inner) : tag_end(s, inner, closer, line);
    if (close == std::string::npos) {
      throw Error("chat template line " + std::to_string(line) + ": a comment opened here is never closed with '#}'");
    }
    const bool strip_after = close > inner && s[close - 1] == '-';
    if (kind != '#') {
      flush(line);
      out.push_back({kind == '{' ? Segment::Kind::kOutput : Segment::Kind::kStatement,
                     s.substr(inner, close - inner - (strip_after ? 1 : 0)), line});
    }
    pos = close + 2;
    if (strip_after) {
      strip_leading = true;
    } else if (kind != '{') {
      // trim_blocks: the first newline after a block or comment tag goes.
      if (pos < s.size() && s[pos] == '\n') ++pos;
    }
    if (pos >= s.size()) {
      flush(line);
      break;
    }
  }
  return out;
}

// ---- tokens of a tag's inside ---------------------------------------------

struct Token {
  enum class Kind { kName, kString, kInteger, kFloat, kOperator, kEnd } kind;
  std::string text;
};

std::vector<Token> tokens_of(const std::string& s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  const auto fail = [&](const std::string& what) -> Error {
    return Error("chat template line " + std::to_string(line) + ": " + what + " in '" + s + "'");
  };
  while (i < s.size()) {
    const char c = s[i];
    if (space(c)) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::Kind::kName, s.substr(i, j - i)});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool real = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        real = true;
        ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        real = true;
        ++j;
        if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      std::string digits;
      for (size_t k = i; k < j; ++k) {
        if (s[k] != '_') digits += s[k];
      }
      out.push_back({real ? Token::Kind::kFloat : Token::Kind::kInteger, digits});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string value;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\') {
          value += s[j];
          continue;
        }
        if (++j >= s.size()) break;
        switch (s[j]) {
          case 'n': value += '\n'; break;
          case 't': value += '\t'; break;
          case 'r': value += '\r'; break;
          case '\\': value += '\\'; break;
          case '\'': value += '\''; break;
          case '"': value += '"'; break;
          case '\n': break;
          default:
            throw fail(std::string("the escape '\\") + s[j] + "' in a string is outside the supported subset");
        }
      }
      if (j >= s.size()) throw fail("a string literal is never closed");
      out.push_back({Token::Kind::kString, value});
      i = j + 1;
    } else {
      static const char* kOperators[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+", "-", "*", "/", "%", "~",
                                         "|",  ".",  ",",  ":",  "(",  ")",  "[", "]", "{", "}", "="};
      bool found = false;
      for (const char* op : kOperators) {
        const size_t n = std::char_traits<char>::length(op);
        if (s.compare(i, n, op) == 0) {
          out.push_back({Token::Kind::kOperator, op});
          i += n;
          found = true;
          break;
        }
      }
      if (!found) throw fail(std::string("the character '") + c + "' is outside the supported subset");
    }
  }
  out.push_back({Token::Kind::kEnd, ""});
  return out;
}

// ---- expressions ----------------------------------------------------------

class ExprParser {
 public:
  ExprParser(const std::string& source, int line) : source_(source), tokens_(tokens_of(source, line)), line_(line) {}

  Error fail(const std::string& what) const {
    return Error("chat template line " + std::to_string(line_) + ": " + what + " in '" + source_ + "'");
  }
  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(at_ + ahead, tokens_.size() - 1)]; }
  bool at_end() const { return peek().kind == Token::Kind::kEnd; }
  bool is_op(const std::string& op, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::kOperator && peek(ahead).text == op;
  }
  bool is_name(const std::string& name, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::kName && peek(ahead).text == name;
  }
  void expect_op(const std::string& op) {
    if (!is_op(op)) throw fail("expected '" + op + "'" + (at_end() ? " at the end" : " before '" + peek().text + "'"));
    ++at_;
  }
  std::string name() {
    if (peek().kind != Token::Kind::kName) throw fail("expected a name" + (at_end() ? "" : " at '" + peek().text + "'"));
    return tokens_[at_++].text;
  }
  void expect_name(const std::string& word) {
    if (!is_name(word)) throw fail("expected '" + word + "'");
    ++at_;
  }
  void expect_end() {
    if (!at_end()) throw fail("unexpected '" + peek().text + "'");
  }

  ExprPtr expression(bool with_condition = true) {
    const Deeper deeper(*this);
    auto e = or_expr();
    if (with_condition && is_name("if")) {
      ++at_;
      auto node = make(Expr::Kind::kTernary);
      node->operands.push_back(or_expr());
      node->operands.push_back(std::move(e));
      if (is_name("else")) {
        ++at_;
        node->operands.push_back(expression());
      }
      return node;
    }
    return e;
  }

 private:
  ExprPtr make(Expr::Kind kind) const {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line_;
    return e;
  }
  ExprPtr binary(std::string op, ExprPtr a, ExprPtr b) const {
    auto e = make(Expr::Kind::kBinary);
    e->op = std::move(op);
    e->operands.push_back(std::move(a));
    e->operands.push_back(std::move(b));
    return e;
  }
  ExprPtr or_expr() {
    auto e = and_expr();
    while (is_name("or")) {
      ++at_;
      e = binary("or", std::move(e), and_expr());
    }
    return e;
  }
  ExprPtr and_expr() {
    auto e = not_expr();
    while (is_name("and")) {
      ++at_;
      e = binary("and", std::move(e), not_expr());
    }
    return e;
  }
  ExprPtr not_expr() {
    const Deeper deeper(*this);
    if (is_name("not")) {
      ++at_;
      auto e = make(Expr::Kind::kUnary);
      e->op = "not";
      e->operands.push_back(not_expr());
      return e;
    }
    return compare();
  }
  // Python's chains: a < b < c is a < b and b < c (b is read twice; the
  // subset's expressions have no side effects).
  ExprPtr compare() {
    auto first = sum();
    std::vector<std::pair<std::string, ExprPtr>> chain;
    for (;;) {
      std::string op;
      if (peek().kind == Token::Kind::kOperator &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = tokens_[at_++].text;
      } else if (is_name("in")) {
        ++at_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        at_ += 2;
        op = "not in";
      } else {
        break;
      }
      chain.emplace_back(op, sum());
    }
    if (chain.empty()) return first;
    ExprPtr result;
    const Expr* left = first.get();
    std::vector<ExprPtr> keep;
    keep.push_back(std::move(first));
    for (auto& [op, right] : chain) {
      auto link = binary(op, copy(*left), copy(*right));
      result = result ? binary("and", std::move(result), std::move(link)) : std::move(link);
      left = right.get();
      keep.push_back(std::move(right));
    }
    return result;
  }
  static ExprPtr copy(const Expr& e) {
    auto out = std::make_unique<Expr>();
    out->kind = e.kind;
    out->value = e.value;
    out->name = e.name;
    out->op = e.op;
    out->negated = e.negated;
    out->line = e.line;
    for (int k = 0; k < 3; ++k) out->has[k] = e.has[k];
    for (const auto& o : e.operands) out->operands.push_back(o ? copy(*o) : nullptr);
    for (const auto& o : e.keys) out->keys.push_back(copy(*o));
    for (const auto& o : e.items) out->items.push_back(copy(*o));
    for (const auto& o : e.arguments.positional) out->arguments.positional.push_back(copy(*o));
    for (const auto& [k, o] : e.arguments.named) out->arguments.named.emplace_back(k, copy(*o));
    return out;
  }
  // Jinja's order: + and - bind looser than ~, which binds looser than *.
  ExprPtr sum() {
    auto e = concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = tokens_[at_++].text;
      e = binary(op, std::move(e), concat());
    }
    return e;
  }
  ExprPtr concat() {
    auto e = product();
    while (is_op("~")) {
      ++at_;
      e = binary("~", std::move(e), product());
    }
    return e;
  }
  ExprPtr product() {
    auto e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = tokens_[at_++].text;
      e = binary(op, std::move(e), power());
    }
    return e;
  }
  ExprPtr power() {
    auto e = unary(true);
    while (is_op("**")) {
      ++at_;
      e = binary("**", std::move(e), unary(true));
    }
    return e;
  }
  ExprPtr unary(bool with_filter) {
    const Deeper deeper(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(Expr::Kind::kUnary);
      e->op = tokens_[at_++].text;
      e->operands.push_back(unary(false));
    } else {
      e = postfix(primary());
    }
    return with_filter ? filters(std::move(e)) : std::move(e);
  }
  ExprPtr primary() {
    const Token t = peek();
    ++at_;
    switch (t.kind) {
      case Token::Kind::kName: {
        auto e = make(Expr::Kind::kLiteral);
        if (t.text == "true" || t.text == "True") {
          e->value = true;
        } else if (t.text == "false" || t.text == "False") {
          e->value = false;
        } else if (t.text == "none" || t.text == "None") {
          e->value = nullptr;
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        return e;
      }
      case Token::Kind::kString: {
        auto e = make(Expr::Kind::kLiteral);
        std::string value = t.text;
        while (peek().kind == Token::Kind::kString) value += tokens_[at_++].text;  // 'a' 'b' is 'ab'
        e->value = value;
        return e;
      }
      case Token::Kind::kInteger: {
        auto e = make(Expr::Kind::kLiteral);
        errno = 0;
        const long long v = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno == ERANGE) throw fail("the integer " + t.text + " is past 64 bits, outside the supported subset");
        e->value = static_cast<int64_t>(v);
        return e;
      }
      case Token::Kind::kFloat: {
        auto e = make(Expr::Kind::kLiteral);
        const double v = std::strtod(t.text.c_str(), nullptr);
        if (!std::isfinite(v)) throw fail("the number " + t.text + " is past a double's range");
        e->value = v;
        return e;
      }
      case Token::Kind::kOperator:
        if (t.text == "(") {
          auto e = expression();
          if (is_op(",")) throw fail("tuples are outside the supported subset");
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto e = make(Expr::Kind::kList);
          while (!is_op("]")) {
            e->items.push_back(expression());
            if (!is_op(",")) break;
            ++at_;
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          auto e = make(Expr::Kind::kDict);
          while (!is_op("}")) {
            e->keys.push_back(expression());
            expect_op(":");
            e->items.push_back(expression());
            if (!is_op(",")) break;
            ++at_;
          }
          expect_op("}");
          return e;
        }
        break;
      case Token::Kind::kEnd:
        throw fail("an expression ends too early");
    }
    throw fail("unexpected '" + t.text + "'");
  }
  void arguments(Arguments& args) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Token::Kind::kName && is_op("=", 1)) {
        std::string key = name();
        ++at_;
        args.named.emplace_back(std::move(key), expression());
      } else {
        if (!args.named.empty()) throw fail("a positional argument after a named one");
        args.positional.push_back(expression());
      }
      if (!is_op(",")) break;
      ++at_;
    }
    expect_op(")");
  }
  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        ++at_;
        auto node = make(Expr::Kind::kAttribute);
        node->name = peek().kind == Token::Kind::kInteger ? tokens_[at_++].text : name();
        node->operands.push_back(std::move(e));
        e = std::move(node);
      } else if (is_op("[")) {
        ++at_;
        e = subscript(std::move(e));
      } else if (is_op("(")) {
        auto node = make(Expr::Kind::kCall);
        node->operands.push_back(std::move(e));
        arguments(node->arguments);
        e = std::move(node);
      } else {
        return e;
      }
    }
  }
  ExprPtr subscript(ExprPtr e) {
    ExprPtr parts[3];
    bool has[3] = {false, false, false};
    int part = 0;
    bool slice = false;
    for (;;) {
      if (is_op(":")) {
        if (part == 2) throw fail("a slice with more than three parts");
        ++at_;
        ++part;
        slice = true;
        continue;
      }
      if (is_op("]")) break;
      if (has[part]) throw fail("expected ':' or ']'");
      parts[part] = expression();
      has[part] = true;
    }
    expect_op("]");
    if (!slice) {
      if (!has[0]) throw fail("an empty subscript");
      auto node = make(Expr::Kind::kSubscript);
      node->operands.push_back(std::move(e));
      node->operands.push_back(std::move(parts[0]));
      return node;
    }
    auto node = make(Expr::Kind::kSlice);
    node->operands.push_back(std::move(e));
    for (int k = 0; k < 3; ++k) {
      node->has[k] = has[k];
      node->operands.push_back(std::move(parts[k]));
    }
    return node;
  }
  ExprPtr filters(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        ++at_;
        auto node = make(Expr::Kind::kFilter);
        node->name = name();
        if (!kFilters.count(node->name)) throw fail("the filter '" + node->name + "' is outside the supported subset");
        node->operands.push_back(std::move(e));
        if (is_op("(")) arguments(node->arguments);
        e = std::move(node);
      } else if (is_name("is")) {
        ++at_;
        auto node = make(Expr::Kind::kTest);
        if (is_name("not")) {
          ++at_;
          node->negated = true;
        }
        if (peek().kind == Token::Kind::kOperator && (peek().text == "==" || peek().text == "!=")) {
          node->name = tokens_[at_++].text;
        } else {
          node->name = name();
        }
        if (!kTests.count(node->name)) throw fail("the test '" + node->name + "' is outside the supported subset");
        node->operands.push_back(std::move(e));
        if (is_op("(")) {
          arguments(node->arguments);
        } else if ((peek().kind == Token::Kind::kName && !is_name("else") && !is_name("or") && !is_name("and") &&
                    !is_name("if") && !is_name("not") && !is_name("in") && !is_name("is")) ||
                   peek().kind == Token::Kind::kString || peek().kind == Token::Kind::kInteger ||
                   peek().kind == Token::Kind::kFloat || is_op("[") || is_op("{")) {
          node->arguments.positional.push_back(postfix(primary()));
        }
        e = std::move(node);
      } else {
        return e;
      }
    }
  }

  // Nesting is bounded: the parser and the renderer recurse, and a
  // hostile template must be refused, not overflow the stack.
  struct Deeper {
    explicit Deeper(ExprParser& p) : p(p) {
      if (++p.depth_ > kMaxNesting) throw p.fail("expressions nest deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    ~Deeper() { --p.depth_; }
    ExprParser& p;
  };
  std::string source_;
  std::vector<Token> tokens_;
  size_t at_ = 0;
  int line_;
  int depth_ = 0;
};

// ---- statements -----------------------------------------------------------

class Parser {
 public:
  explicit Parser(std::vector<Segment> segments) : segments_(std::move(segments)) {}

  // Nodes up to a statement whose first word is one of `ends`, which is
  // left as the current segment (none: to the end of the template).
  Body body(const std::set<std::string>& ends, const std::string& opened, int opened_line) {
    Body out;
    while (at_ < segments_.size()) {
      const Segment& s = segments_[at_];
      if (s.kind == Segment::Kind::kText) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kText;
        node->text = s.text;
        node->line = s.line;
        out.push_back(std::move(node));
        ++at_;
        continue;
      }
      if (s.kind == Segment::Kind::kOutput) {
        ExprParser p(s.text, s.line);
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kOutput;
        node->expr = p.expression();
        p.expect_end();
        node->line = s.line;
        out.push_back(std::move(node));
        ++at_;
        continue;
      }
      ExprParser p(s.text, s.line);
      const std::string word = p.name();
      if (ends.count(word)) return out;
      out.push_back(statement(word, p, s.line));
    }
    if (!ends.empty()) {
      throw Error("chat template line " + std::to_string(opened_line) + ": '" + opened + "' is never closed (expected '" +
                  *ends.rbegin() + "')");
    }
    return out;
  }

 private:
  std::unique_ptr<Node> statement(const std::string& word, ExprParser& p, int line) {
    auto node = std::make_unique<Node>();
    node->line = line;
    ++at_;
    if (word == "if" || word == "for" || word == "generation") {
      if (depth_ >= kMaxNesting) throw p.fail("blocks nest deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    struct Nest {
      int& depth;
      explicit Nest(int& d) : depth(++d) {}
      ~Nest() { --depth; }
    } nest(depth_);
    if (word == "if") {
      node->kind = Node::Kind::kIf;
      auto condition = p.expression();
      p.expect_end();
      for (;;) {
        Body branch = body({"elif", "else", "endif"}, "if", line);
        node->branches.emplace_back(std::move(condition), std::move(branch));
        ExprParser end(segments_[at_].text, segments_[at_].line);
        const std::string next = end.name();
        ++at_;
        if (next == "endif") {
          end.expect_end();
          break;
        }
        if (next == "else") {
          end.expect_end();
          Body last = body({"endif"}, "if", line);
          node->branches.emplace_back(nullptr, std::move(last));
          ExprParser close(segments_[at_].text, segments_[at_].line);
          close.name();
          close.expect_end();
          ++at_;
          break;
        }
        condition = end.expression();
        end.expect_end();
      }
      return node;
    }
    if (word == "for") {
      node->kind = Node::Kind::kFor;
      node->targets.push_back(p.name());
      while (p.is_op(",")) {
        p.expect_op(",");
        node->targets.push_back(p.name());
      }
      p.expect_name("in");
      node->expr = p.expression(/*with_condition=*/false);
      if (p.is_name("if")) {
        p.expect_name("if");
        node->filter = p.expression(false);
      }
      if (p.is_name("recursive")) throw p.fail("recursive loops are outside the supported subset");
      p.expect_end();
      ++loops_;
      node->body = body({"else", "endfor"}, "for", line);
      --loops_;
      ExprParser end(segments_[at_].text, segments_[at_].line);
      const std::string next = end.name();
      end.expect_end();
      ++at_;
      if (next == "else") {
        node->otherwise = body({"endfor"}, "for", line);
        ++at_;
      }
      return node;
    }
    if (word == "set") {
      node->kind = Node::Kind::kSet;
      node->targets.push_back(p.name());
      if (p.is_op(".")) {
        p.expect_op(".");
        node->attribute = p.name();
      } else {
        while (p.is_op(",")) {
          p.expect_op(",");
          node->targets.push_back(p.name());
        }
      }
      if (!p.is_op("=")) throw p.fail("block assignments ({% set x %}...{% endset %}) are outside the supported subset");
      p.expect_op("=");
      node->expr = p.expression();
      p.expect_end();
      return node;
    }
    if (word == "break" || word == "continue") {
      if (loops_ == 0) throw p.fail("'" + word + "' outside a loop");
      node->kind = word == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      p.expect_end();
      return node;
    }
    if (word == "generation") {
      node->kind = Node::Kind::kGeneration;
      p.expect_end();
      node->body = body({"endgeneration"}, "generation", line);
      ++at_;
      return node;
    }
    if (word.rfind("end", 0) == 0) throw p.fail("'" + word + "' closes nothing that is open");
    throw p.fail("the statement '" + word + "' is outside the supported subset");
  }

  std::vector<Segment> segments_;
  size_t at_ = 0;
  int depth_ = 0;  // blocks open
  int loops_ = 0;  // for-loop bodies open (the else branch is outside)
};

}  // namespace

bool is_supported_test(const std::string& name) { return kTests.count(name) > 0; }

std::unique_ptr<Template> parse(const std::string& source) {
  Parser parser(segments_of(source));
  auto t = std::make_unique<Template>();
  t->body = parser.body({}, "", 0);
  return t;
}

}  // namespace fsdp::data::jinja
