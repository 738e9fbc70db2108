// The Jinja subset against jinja2 in transformers' environment: every template of
// tests/models/fixtures/chat_templates (the families' real templates and one exercising the
// subset's features) rendered on a set of conversations by scripts/make-chat-template-fixtures.py
// must render identically here, or fail where jinja2 raised. Plus the refusals of what the
// subset does not implement, each named.
#include "text/jinja_template.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace moeserve::jinja {
namespace {

using Json = nlohmann::ordered_json;

std::string Dir() {
  return std::string(MOESERVE_SOURCE_DIR) + "/tests/models/fixtures/chat_templates";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> TemplateNames() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(Dir())) {
    const std::string f = e.path().filename().string();
    if (f.size() > 6 && f.substr(f.size() - 6) == ".jinja")
      names.push_back(f.substr(0, f.size() - 6));
  }
  std::sort(names.begin(), names.end());
  return names;
}

class ChatTemplateFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateFixtureTest, RendersAsJinja2Does) {
  auto t = Template::Parse(ReadAll(Dir() + "/" + GetParam() + ".jinja"));
  ASSERT_TRUE(t.ok()) << t.status();
  std::ifstream in(Dir() + "/" + GetParam() + ".expected.jsonl");
  ASSERT_TRUE(in.good()) << "run scripts/make-chat-template-fixtures.py";
  int cases = 0, wrong = 0;
  std::string line;
  while (std::getline(in, line)) {
    ++cases;
    const Json e = Json::parse(line);
    absl::StatusOr<std::string> got = (*t)->Render(e["context"]);
    if (e.contains("error")) {
      if (got.ok() && ++wrong <= 3) {
        ADD_FAILURE() << "case " << cases << ": jinja2 raised \"" << e["error"].get<std::string>()
                      << "\" but this rendered " << Json(*got).dump();
      } else if (!got.ok()) {
        EXPECT_NE(got.status().message().find(e["error"].get<std::string>()), std::string::npos)
            << got.status();
      }
      continue;
    }
    const std::string want = e["rendered"].get<std::string>();
    if (!got.ok()) {
      if (++wrong <= 3) ADD_FAILURE() << "case " << cases << ": " << got.status();
      continue;
    }
    if (*got != want && ++wrong <= 3) {
      size_t at = 0;
      while (at < got->size() && at < want.size() && (*got)[at] == want[at]) ++at;
      ADD_FAILURE() << "case " << cases << " differs at byte " << at
                    << ":\n got:  " << Json(got->substr(at > 40 ? at - 40 : 0, 120)).dump()
                    << "\n want: " << Json(want.substr(at > 40 ? at - 40 : 0, 120)).dump();
    }
  }
  EXPECT_GT(cases, 0);
  EXPECT_EQ(wrong, 0) << "of " << cases << " renderings";
}

INSTANTIATE_TEST_SUITE_P(Templates, ChatTemplateFixtureTest, ::testing::ValuesIn(TemplateNames()));

TEST(ChatTemplateTest, WhatIsNotImplementedIsRefusedByName) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% macro f() %}x{% endmacro %}", "{% macro %} is not supported"},
      {"{% include 'x' %}", "{% include %} is not supported"},
      {"{{ x | wordwrap }}", "filter 'wordwrap' is not supported"},
      {"{{ x is sameas_not_a_test }}", "test 'is sameas_not_a_test' is not supported"},
      {"{{ cycler() }}", "function cycler() is not supported"},
      {"{{ x.format(1) }}", "method .format() is not supported"},
      {"{% set x %}block{% endset %}", "{% set %} blocks"},
      {"\n\n{{ 'unterminated }}", "line 3: unterminated string"},
      {"{% if x %}no end", "missing {% endif %}"},
      {"{% endfor %}", "unexpected {% endfor %}"},
  };
  for (const auto& [source, want] : cases) {
    auto t = Template::Parse(source);
    ASSERT_FALSE(t.ok()) << source;
    EXPECT_NE(t.status().message().find(want), std::string::npos) << source << ": " << t.status();
  }
}

TEST(ChatTemplateTest, ErrorsAtRenderNameTheLineAndRunawayLoopsStop) {
  auto t = Template::Parse("line1\n{{ raise_exception('Roles must alternate') }}");
  ASSERT_TRUE(t.ok());
  auto r = (*t)->Render(Json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "chat template line 2: Roles must alternate");
  auto loop = Template::Parse(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  ASSERT_TRUE(loop.ok());
  auto l = (*loop)->Render(Json::object());
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("steps"), std::string::npos) << l.status();
  auto type = Template::Parse("{{ 'a' + 1 }}");
  ASSERT_TRUE(type.ok());
  auto tr = (*type)->Render(Json::object());
  ASSERT_FALSE(tr.ok());
  EXPECT_NE(tr.status().message().find("unsupported operand types for +: 'str' and 'int'"),
            std::string::npos);
}

}  // namespace
}  // namespace moeserve::jinja
