// The chat-template renderer on the semantics the families' templates rely
// on, each value written by hand from Jinja's and Python's rules (the
// families' own templates are compared with transformers in
// tests/reference/chat_template_test.py).

#include <gtest/gtest.h>

#include "fsdp/common/error.h"
#include "fsdp/data/chat_template.h"

namespace fsdp::data {
namespace {

using Json = nlohmann::ordered_json;

std::string render(const std::string& source, const Json& context = Json::object()) {
  return ChatTemplate(source).render(context);
}

std::string refusal(const std::string& source, const Json& context = Json::object()) {
  try {
    render(source, context);
  } catch (const Error& e) {
    return e.what();
  }
  return "(rendered)";
}

TEST(ChatTemplate, BlockTagsTakeTheirLineAndTheNewlineAfterThemAsTransformersSetsJinja) {
  // lstrip_blocks: the indentation before a block tag goes; trim_blocks:
  // the newline after it; an output tag keeps both; '-' strips all
  // whitespace on its side; one trailing newline of the template goes.
  EXPECT_EQ(render("  {% if true %}\n  a\n  {% endif %}\n  b {{ 1 }}  {# c #}\n{%- if 1 %} z {% endif -%}   \n  q\n"),
            "  a\n  b 1   z q");
}

TEST(ChatTemplate, ValuesAreWrittenAsPythonWritesThem) {
  EXPECT_EQ(render("{{ none }}|{{ [1, 'a', none, true, {'k': 1.0}] }}|{{ 7 / 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 'x' ~ 1 }}"),
            "None|[1, 'a', None, True, {'k': 1.0}]|3.5|-4|2|x1");
  EXPECT_EQ(render("{{ x | tojson }}|{{ x | tojson(indent=2) }}", {{"x", {{"b", 1}, {"a", {"é", "\n"}}}}}),
            "{\"b\": 1, \"a\": [\"é\", \"\\n\"]}|{\n  \"b\": 1,\n  \"a\": [\n    \"é\",\n    \"\\n\"\n  ]\n}");
}

TEST(ChatTemplate, OperatorsBindAndChainAsInJinja) {
  // ~ binds tighter than + (so 'n=' + (1 ~ '')), comparisons chain as in
  // Python, a negative power is a float, True is 1.
  EXPECT_EQ(render("{{ 'n=' + 1 ~ '' }}|{{ 1 == 1 == 1 }}|{{ 1 < 3 < 2 }}|{{ 2 ** -1 }}|{{ true == 1 }}|{{ [3, 1] < [3, 2] }}"),
            "n=1|True|False|0.5|True|True");
  EXPECT_EQ(render("{{ {'a': {'b': 1}} }}|{{ 'abc'.0 }}|{{ 'ÉCOLE'|lower }}|{{ 'straße'|upper }}"),
            "{'a': {'b': 1}}|a|école|STRASSE");
  EXPECT_EQ(render("a\r\nb\r"), "a\nb");  // newlines read as \n; the trailing one goes
}

TEST(ChatTemplate, HostileTemplatesAreRefusedNotCrashed) {
  EXPECT_NE(refusal("{{ (-9223372036854775807 - 1) // -1 }}").find("past 64 bits"), std::string::npos);
  EXPECT_NE(refusal("{{ 9223372036854775807 + 1 }}").find("past 64 bits"), std::string::npos);
  EXPECT_EQ(render("{{ [1, 2, 3][1::9223372036854775807] }}"), "[2]");
  EXPECT_NE(refusal("{{ range(100001) | length }}").find("more than 100000"), std::string::npos);
  EXPECT_NE(refusal("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nest deeper"),
            std::string::npos);
  std::string blocks;
  for (int i = 0; i < 500; ++i) blocks += "{% if true %}";
  EXPECT_NE(refusal(blocks).find("nest deeper"), std::string::npos);
  EXPECT_NE(refusal("{{ 99999999999999999999 }}").find("past 64 bits"), std::string::npos);
  EXPECT_NE(refusal("{{ 'a,b,c'.split(',', 1, 2) }}").find("outside the supported subset"), std::string::npos);
  EXPECT_EQ(render("{{ 'a,b,c'.split(',', 1) }}|{{ 'aaa'.replace('a', 'b', 2) }}"), "['a', 'b,c']|bba");
}

// A template's work is bounded ([Note: a template's bounds]): each of
// these ran until killed, or died of std::bad_alloc, before the bounds;
// now each is refused by name, having built no more than the budget.
TEST(ChatTemplate, TemplatesThatRunWithoutBoundAreRefusedByTheBoundTheyPass) {
  const std::string budget = "MiB of strings and lists";
  EXPECT_NE(refusal("{{ 'a' * 100000000000 }}").find(budget), std::string::npos);
  EXPECT_NE(refusal("{{ 'ab' * 9223372036854775807 }}").find(budget), std::string::npos);
  EXPECT_NE(refusal("{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}"
                    "{% endfor %}{% endfor %}{% endfor %}")
                .find("more than 1000000 iterations"),
            std::string::npos);
  EXPECT_NE(refusal("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                .find(budget),
            std::string::npos);
  EXPECT_NE(refusal("{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}")
                .find(budget),
            std::string::npos);
  EXPECT_NE(refusal("{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s.replace('a', 'aa') %}"
                    "{% endfor %}")
                .find(budget),
            std::string::npos);
  EXPECT_NE(refusal("{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s | replace('a', 'aa') %}"
                    "{% endfor %}")
                .find(budget),
            std::string::npos);
  EXPECT_NE(refusal("{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = [ns.l] %}{% endfor %}"
                    "{{ ns.l | tojson }}")
                .find("nests deeper than 128 levels"),
            std::string::npos);
  EXPECT_NE(refusal("{% set ns = namespace(d={}) %}{% for i in range(5000) %}{% set ns.d = dict(a=ns.d) %}{% endfor %}")
                .find("nests deeper than 128 levels"),
            std::string::npos);
  EXPECT_NE(refusal(std::string(kMaxTemplateBytes + 1, '\0')).find("a template is at most 1 MiB"), std::string::npos);
  // Parsing is linear: 80,000 block tags on one line (a rescan of the line
  // per tag took minutes) are refused at the nesting bound at once.
  std::string deep;
  for (int i = 0; i < 80000; ++i) deep += "{% if 1 %}";
  EXPECT_NE(refusal(deep).find("nest deeper"), std::string::npos);
  // Within the bounds, what real templates do renders as before.
  EXPECT_EQ(render("{% set ns = namespace(l=[]) %}{% for i in range(3) %}{% set ns.l = ns.l + [i] %}{% endfor %}"
                   "{{ ns.l }}|{{ 'ab' * 3 }}|{{ 'aXa' | replace('a', 'bb') }}"),
            "[0, 1, 2]|ababab|bbXbb");
}

TEST(ChatTemplate, SetInsideALoopLastsOneIterationAndANamespaceCarriesOut) {
  EXPECT_EQ(render("{% set x = 0 %}{% for i in [1, 2, 3] %}{{ x }}{% set x = i %}{{ x }};{% endfor %}|{{ x }}"),
            "01;02;03;|0");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "6");
}

TEST(ChatTemplate, LoopsFilterThenCountAndSlicesFollowPython) {
  EXPECT_EQ(render("{% for m in ms if m.r != 'x' %}{{ loop.index0 }}{{ m.r }}{{ loop.last }},{% endfor %}",
                   {{"ms", Json::array({{{"r", "a"}}, {{"r", "x"}}, {{"r", "b"}}})}}),
            "0aFalse,1bTrue,");
  EXPECT_EQ(render("{{ s[::-1] }}|{{ s[1:] }}|{{ s[:-1] }}|{{ l[-1] }}|{{ l[5] is defined }}",
                   {{"s", "añb"}, {"l", {1, 2, 3}}}),
            "bña|ñb|añ|3|False");
  EXPECT_EQ(render("{{ s.split('</think>')[-1].lstrip('\\n') }}|{{ s.startswith('<think>') }}|{{ '  x '|trim }}",
                   {{"s", "<think>\nr\n</think>\n\nanswer"}}),
            "answer|True|x");
  EXPECT_EQ(render("{{ ms | selectattr('role', 'equalto', 'user') | list | length }}"
                   "{{ ms | rejectattr('role', 'equalto', 'user') | map(attribute='c') | join(',') }}",
                   {{"ms", Json::array({{{"role", "user"}, {"c", "1"}}, {{"role", "bot"}, {"c", "2"}}})}}),
            "12");
}

TEST(ChatTemplate, AnUndefinedValueWritesNothingAndItsAttributeIsRefusedNamingIt) {
  EXPECT_EQ(render("[{{ missing }}]{{ missing is defined }}{{ d.nokey is defined }}", {{"d", Json::object()}}), "[]FalseFalse");
  EXPECT_NE(refusal("{{ missing.attr }}").find("'missing' is undefined"), std::string::npos);
  EXPECT_NE(refusal("{{ raise_exception('roles must alternate') }}").find("roles must alternate"), std::string::npos);
}

TEST(ChatTemplate, ConstructsOutsideTheSubsetAreRefusedWhenParsedNamingTheLine) {
  for (const auto& [source, construct] : std::vector<std::pair<std::string, std::string>>{
           {"a\n{% macro m() %}{% endmacro %}", "line 2: the statement 'macro'"},
           {"\n\n{{ x | wordcount }}", "line 3: the filter 'wordcount'"},
           {"{{ x is callable }}", "line 1: the test 'callable'"},
           {"{% for x in y %}", "'for' is never closed"},
           {"{% endif %}", "'endif' closes nothing"},
           {"{% set x %}a{% endset %}", "block assignments"},
           {"{% break %}", "'break' outside a loop"},
           {"{{ 'a }}", "never closed"}}) {
    try {
      ChatTemplate t(source);
      ADD_FAILURE() << source << " parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(construct), std::string::npos) << source << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace fsdp::data
