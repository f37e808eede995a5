// Chat templates' statements, rendered: text and {{ output }}, if, for
// (with its filter, loop.* and else), set (of a namespace's attribute
// too), break, continue and generation; and the scopes they assign to.

#include "chat_template_renderer.h"

namespace fsdp::data::jinja {

Flow Renderer::body(const Body& nodes) {
  for (const auto& node : nodes) {
    const Flow flow = run(*node);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Value Renderer::lookup(const std::string& name) const {
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
    if (auto found = it->find(name); found != it->end()) return found->second;
  }
  return Value::undefined(name);
}

void Renderer::assign(const std::vector<std::string>& targets, const Value& v, int line) {
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

Flow Renderer::loop(const Node& node) {
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
    Json loop = {{"index0", i}, {"index", i + 1},    {"first", i == 0},       {"last", i == n - 1},
                 {"length", n}, {"revindex", n - i}, {"revindex0", n - i - 1}};
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

Flow Renderer::run(const Node& node) {
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
    case Node::Kind::kFor:
      return loop(node);
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
    case Node::Kind::kBreak:
      return Flow::kBreak;
    case Node::Kind::kContinue:
      return Flow::kContinue;
    case Node::Kind::kGeneration:
      return body(node.body);
  }
  return Flow::kNormal;
}

}  // namespace fsdp::data::jinja
