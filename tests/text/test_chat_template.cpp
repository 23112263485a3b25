// fsdp::text::ChatTemplate: the Jinja semantics hub chat templates lean on
// (whitespace control with trim_blocks/lstrip_blocks, loop.*, macros,
// namespaces, Python's repr of printed values, tojson's spacing), errors that
// name file and line, and refusals at load. Identity with transformers on
// real hub templates is tested by chat_template_reference.py.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include "fsdp/chat_template.h"

namespace {

using fsdp::text::ChatTemplate;

std::string render(const std::string& source, const std::string& variables = "{}") {
  return ChatTemplate(source, "t.jinja").render(variables).text;
}

// The message of the std::runtime_error that `action` throws ("" if none).
template <typename Action>
std::string error_of(Action action) {
  try {
    action();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplate, TrimAndLstripBlocks) {
  // trim_blocks drops the newline after a tag, lstrip_blocks the indentation before it.
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc\n"), "a\n  b\nc");
  // '-' strips all whitespace on its side; '+' keeps what lstrip_blocks would take.
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("x\n  {%+ if true %}y{% endif %}"), "x\n  y");
  // {{ }} is untouched by either; a single trailing newline of the template is dropped.
  EXPECT_EQ(render("  {{ 'v' }}  \n\n"), "  v  \n");
  EXPECT_EQ(render("a{# comment #}\nb{% raw %}{{ x }}{% endraw %}"), "ab{{ x }}");
}

TEST(ChatTemplate, LoopVariables) {
  EXPECT_EQ(render("{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
                   "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.cycle('+','-') }};"
                   "{% endfor %}"),
            "103TrueFalse3+;212FalseFalse3a-;321FalseTrue3b+;");
  EXPECT_EQ(render("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.index }}{% endfor %}"
                   "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}"),
            "2142empty");
  EXPECT_EQ(render("{% for i in range(9) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}"
                   "{% endif %}{{ i }}{% endfor %}"),
            "023");
}

TEST(ChatTemplate, MacrosAndNamespaces) {
  EXPECT_EQ(render("{% macro m(a, b=2, c='z') %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 3) }}"
                   "{{ m(1, c='q') }}"),
            "[12z][13z][12q]");
  // A set inside a loop is the loop's own; a namespace carries values out.
  EXPECT_EQ(render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set n = n + i %}"
                   "{% set ns.n = ns.n + i %}{% endfor %}{{ n }} {{ ns.n }}"),
            "0 6");
  EXPECT_EQ(render("{% set b %}x{{ 1 + 1 }}{% endset %}{{ b }}{% filter upper %}f{% endfilter %}"), "x2F");
}

TEST(ChatTemplate, PrintsAsPythonDoes) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}] }}|{{ none }}|{{ (1,) }}|{{ 1e20 }}|{{ 7 / 2 }}"),
            "[1, 'a', None, True, 1.5, {'k': \"it's\"}]|None|(1,)|1e+20|3.5");
  EXPECT_EQ(render("{{ 'abc'[::-1] }}{{ [1,2,3][-1] }}{{ ' a b '.split() }}{{ '%s-%d' % ('x', 3) }}{{ 7 // 2 }}"),
            "cba3['a', 'b']x-33");
}

TEST(ChatTemplate, TojsonSpacing) {
  EXPECT_EQ(render("{{ {'a': [1, 2], 'b': 'ü'}|tojson }}"), "{\"a\": [1, 2], \"b\": \"ü\"}");
  EXPECT_EQ(render("{{ {'a': [1]}|tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2}|tojson(separators=(',', ':'), sort_keys=true) }}"), "{\"a\":2,\"b\":1}");
  // Object keys keep the order the variables gave them.
  EXPECT_EQ(render("{{ m|tojson }}", "{\"m\": {\"z\": 1, \"a\": 2}}"), "{\"z\": 1, \"a\": 2}");
}

TEST(ChatTemplate, MessagesAndGeneration) {
  const std::string source =
      "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
      "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}";
  ChatTemplate chat(source, "gen.jinja");
  EXPECT_TRUE(chat.has_generation_markers());
  auto r = chat.render(R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                           "add_generation_prompt": false})");
  EXPECT_EQ(r.text, "<user>hi<assistant>yo");
  ASSERT_EQ(r.generation_ranges.size(), 1u);
  EXPECT_EQ(r.text.substr(r.generation_ranges[0].first, r.generation_ranges[0].second - r.generation_ranges[0].first),
            "yo");
  EXPECT_FALSE(ChatTemplate("x", "plain.jinja").has_generation_markers());
}

TEST(ChatTemplate, RaiseExceptionNamesFileAndLine) {
  ChatTemplate chat("line one\n{% if messages|length == 0 %}\n{{ raise_exception('No messages!') }}\n{% endif %}",
                    "strict.jinja");
  EXPECT_EQ(error_of([&] { chat.render(R"({"messages": []})"); }), "strict.jinja:3: No messages!");
  EXPECT_EQ(chat.render(R"({"messages": [1]})").text, "line one\n");
}

TEST(ChatTemplate, RefusesAtLoadNamingFileAndLine) {
  std::string error = error_of([] { ChatTemplate("ok\n{{ x | no_such_filter }}", "bad.jinja"); });
  EXPECT_NE(error.find("bad.jinja:2"), std::string::npos) << error;
  EXPECT_NE(error.find("no_such_filter"), std::string::npos) << error;
  error = error_of([] { ChatTemplate("{% include 'other.jinja' %}", "inc.jinja"); });
  EXPECT_NE(error.find("inc.jinja:1: unsupported statement {% include %}"), std::string::npos) << error;
  error = error_of([] { ChatTemplate("{% if x is frobnicated %}{% endif %}", "test.jinja"); });
  EXPECT_NE(error.find("unsupported test 'frobnicated'"), std::string::npos) << error;
  error = error_of([] { ChatTemplate("a\n{% break %}", "break.jinja"); });
  EXPECT_NE(error.find("break.jinja:2: {% break %} outside a loop"), std::string::npos) << error;
  error = error_of([] { ChatTemplate("{% if x %}never closed", "open.jinja"); });
  EXPECT_NE(error.find("open.jinja"), std::string::npos) << error;
}

TEST(ChatTemplate, SandboxAndHostileInput) {
  // The immutable sandbox refuses list.append; undefined attributes of undefined values raise.
  EXPECT_NE(error_of([] { render("{% set l = [] %}{{ l.append(1) }}"); }).find("unsafe"), std::string::npos);
  EXPECT_NE(error_of([] { render("{{ nothing.here }}"); }).find("'nothing' is undefined"), std::string::npos);
  // Unbounded recursion and nesting are refused, not followed.
  EXPECT_NE(error_of([] { render("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}"); }).find("deeper"),
            std::string::npos);
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_NE(error_of([&] { ChatTemplate(deep, "deep.jinja"); }).find("nested deeper"), std::string::npos);
  EXPECT_NE(error_of([] { render("{% for i in range(1000000) %}{% endfor %}"); }).find("MAX_RANGE"),
            std::string::npos);
  // Values nested without bound, or a namespace holding itself, would recurse past the stack when freed.
  EXPECT_NE(error_of([] {
              render("{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}");
            }).find("nested deeper than 512"),
            std::string::npos);
  EXPECT_NE(error_of([] { render("{% set ns = namespace() %}{% set ns.me = [ns] %}"); }).find("cannot hold itself"),
            std::string::npos);
}

TEST(ChatTemplate, ModelFolder) {
  std::string dir = ::testing::TempDir() + "fsdp_chat_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  EXPECT_NE(error_of([&] { ChatTemplate::from_model_folder(dir); }).find(dir), std::string::npos);
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>",
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}{{ eos_token }}{{ x }}"}]})";
  ChatTemplate chat = ChatTemplate::from_model_folder(dir);
  EXPECT_EQ(chat.render(R"({"x": 1})").text, "<s></s>1");
  EXPECT_EQ(chat.render(R"({"eos_token": "E"})").text, "<s>E");
  std::ofstream(dir + "/chat_template.jinja") << "file {{ bos_token }}\n";
  EXPECT_EQ(ChatTemplate::from_model_folder(dir).render("{}").text, "file <s>");
  std::remove((dir + "/chat_template.jinja").c_str());
  std::remove((dir + "/tokenizer_config.json").c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
