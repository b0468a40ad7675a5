#include "grammar/grammar.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/json_schema.h"
#include "util/grammar_matches.h"

namespace deepinfer::grammar {
namespace {

// A small vocabulary: every single byte, some words and JSON-ish pieces, and EOS (id 0).
std::shared_ptr<const TokenVocab> small_vocab() {
  std::vector<std::string> t{""};  // 0: EOS
  for (int b = 1; b < 256; ++b) t.push_back(std::string(1, char(b)));
  t.push_back(std::string(1, '\0'));
  for (const char* w :
       {"{\"",      "\":",        "\": ", "\",",  "\"}", "true",   "false",    "null",
        " \"",      "ab",         "abc",  "12",   "123", "-1",     ".5",       "e+",
        "\n  ",     "}}",         "]}",   "[{",   "},{", "\\u00",  "\\n",      "é",
        "\xc3",     "\xa9x",      "Ж",    "日本", "</",  "think>", "</think>", "</think>{",
        "\"name\"", "\"age\": 4", "  ",   "   ",  "    "})
    t.push_back(w);
  t.push_back("");  // a special token: never allowed
  return std::make_shared<TokenVocab>(std::move(t), 0);
}

std::shared_ptr<const Grammar> compile(const Expr& e) {
  return Grammar::compile(e, small_vocab());
}

TEST(Grammar, ExpressionsMatchTheirLanguage) {
  auto g = compile(seq({lit("ab"), alt({lit("c"), lit("de")}), repeat(lit("x"), 1, 3)}));
  EXPECT_TRUE(matches(g, "abcx"));
  EXPECT_TRUE(matches(g, "abdexxx"));
  EXPECT_FALSE(matches(g, "abdexxxx"));
  EXPECT_FALSE(matches(g, "abc"));
  EXPECT_FALSE(matches(g, "abx"));

  auto l = compile(list(lit("a"), lit(","), 2, 3));
  EXPECT_FALSE(matches(l, "a"));
  EXPECT_TRUE(matches(l, "a,a"));
  EXPECT_TRUE(matches(l, "a,a,a"));
  EXPECT_FALSE(matches(l, "a,a,a,a"));
  auto lu = compile(list(lit("a"), lit(","), 0, -1));
  EXPECT_TRUE(matches(lu, ""));
  EXPECT_TRUE(matches(lu, "a,a,a,a,a"));
  EXPECT_FALSE(matches(lu, "a,"));

  auto m = compile(members({{lit("A"), true}, {lit("B"), false}, {lit("C"), false}}, lit(",")));
  for (const char* ok : {"A", "A,B", "A,C", "A,B,C"}) EXPECT_TRUE(matches(m, ok)) << ok;
  for (const char* bad : {"", "B", "A,", "A,C,B", "AB", ",A"}) EXPECT_FALSE(matches(m, bad)) << bad;
  auto mo = compile(members({{lit("A"), false}, {lit("B"), false}}, lit(",")));
  for (const char* ok : {"", "A", "B", "A,B"}) EXPECT_TRUE(matches(mo, ok)) << ok;
  EXPECT_FALSE(matches(mo, ",B"));

  auto u = compile(seq({until("</think>"), lit("!")}));
  EXPECT_TRUE(matches(u, "</think>!"));
  EXPECT_TRUE(matches(u, "a</b</thin</think>!"));
  EXPECT_TRUE(matches(u, "<</</think>!"));
  EXPECT_FALSE(matches(u, "a</think>b</think>!"));
  EXPECT_FALSE(matches(u, "abc!"));

  auto c = compile(repeat(utf8_char("\""), 0, -1));
  EXPECT_TRUE(matches(c, "héllo Жж 日本 \xf0\x9f\x98\x80"));
  EXPECT_FALSE(matches(c, "\xc3"));          // cut character
  EXPECT_FALSE(matches(c, "\xed\xa0\x80"));  // surrogate
  EXPECT_FALSE(matches(c, "\xc0\xaf"));      // overlong
  EXPECT_FALSE(matches(c, "a\"b"));
}

std::shared_ptr<const Grammar> schema(const std::string& s) {
  return compile(JsonSchema(s).value());
}

TEST(JsonSchemaGrammar, IntegerBoundsAreExact) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int lo = int(rng() % 2000) - 1000, hi = lo + int(rng() % 1500);
    auto g = schema("{\"type\":\"integer\",\"minimum\":" + std::to_string(lo) +
                    ",\"maximum\":" + std::to_string(hi) + "}");
    for (int v = lo - 30; v <= hi + 30; v += (hi - lo) / 50 + 1)
      EXPECT_EQ(matches(g, std::to_string(v)), v >= lo && v <= hi) << lo << ".." << hi << " " << v;
    EXPECT_EQ(matches(g, std::to_string(lo)), true);
    EXPECT_EQ(matches(g, std::to_string(hi)), true);
    EXPECT_FALSE(matches(g, std::to_string(hi + 1)));
    EXPECT_FALSE(matches(g, std::to_string(lo - 1)));
  }
  auto g = schema(R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":100})");
  EXPECT_FALSE(matches(g, "0"));
  EXPECT_TRUE(matches(g, "1"));
  EXPECT_TRUE(matches(g, "99"));
  EXPECT_FALSE(matches(g, "100"));
  EXPECT_FALSE(matches(g, "01"));
  EXPECT_FALSE(matches(g, "1.0"));
  auto any = schema(R"({"type":"integer"})");
  EXPECT_TRUE(matches(any, "-123456789012345"));
  EXPECT_FALSE(matches(any, "1234567890123456"));  // 16 digits: beyond the bound
  EXPECT_FALSE(matches(any, "-0"));
  EXPECT_FALSE(matches(any, "00"));
}

TEST(JsonSchemaGrammar, NumberBoundsAreExact) {
  struct Case {
    const char* schema;
    std::vector<std::pair<const char*, bool>> texts;
  };
  const std::vector<Case> cases = {
      {R"({"type":"number","minimum":0,"maximum":1})",
       {{"0", true},
        {"0.5", true},
        {"1", true},
        {"1.0", true},
        {"1.01", false},
        {"-0.1", false},
        {"-0", false},
        {"2", false},
        {"0.999", true}}},
      {R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1})",
       {{"0", false}, {"0.0", false}, {"0.001", true}, {"1", false}, {"0.99", true}}},
      {R"({"type":"number","minimum":-2,"maximum":3})",
       {{"-2", true},
        {"-2.0", true},
        {"-2.5", false},
        {"-1.5", true},
        {"-0.5", true},
        {"0", true},
        {"3", true},
        {"3.5", false},
        {"2.75", true}}},
      {R"({"type":"number","maximum":-1})",
       {{"-1", true}, {"-0.5", false}, {"-1.5", true}, {"0", false}, {"-100.25", true}}},
      {R"({"type":"number","exclusiveMaximum":-1})",
       {{"-1", false}, {"-1.0", false}, {"-1.5", true}}},
      {R"({"type":"number"})",
       {{"1e5", true}, {"-0.25E-3", true}, {"1.", false}, {".5", false}, {"01", false}}},
  };
  for (const Case& c : cases) {
    auto g = schema(c.schema);
    for (const auto& [t, ok] : c.texts) EXPECT_EQ(matches(g, t), ok) << c.schema << " " << t;
  }
}

TEST(JsonSchemaGrammar, ObjectsArraysAndStrings) {
  auto g = schema(R"({"type":"object","properties":{
      "name":{"type":"string","minLength":1,"maxLength":4},
      "age":{"type":"integer","minimum":0,"maximum":150},
      "tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2},
      "ok":{"type":["boolean","null"]}},
      "required":["name","age"],"additionalProperties":false})");
  for (const char* ok :
       {R"({"name":"Bo","age":3})", R"({ "name" : "Bo" , "age" : 3 })",
        R"({"name":"é\n\u00e9","age":150,"tags":["a","b"]})", R"({"name":"x","age":0,"ok":null})",
        R"({"name":"x","age":0,"tags":[]})", "{\n  \"name\": \"x\",\n  \"age\": 1\n}"})
    EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad :
       {R"({"age":3,"name":"Bo"})", R"({"name":"","age":3})", R"({"name":"Bob12","age":3})",
        R"({"name":"Bo"})", R"({"name":"Bo","age":151})", R"({"name":"Bo","age":3,"tags":["c"]})",
        R"({"name":"Bo","age":3,"tags":["a","a","a"]})", R"({"name":"Bo","age":3,"x":1})",
        R"({"name":"B\ud800","age":3})", R"({"name":"Bo","age":3,})"})
    EXPECT_FALSE(matches(g, bad)) << bad;
  // Whitespace runs are bounded.
  EXPECT_FALSE(matches(g, "{" + std::string(40, ' ') + R"("name":"x","age":1})"));

  auto formats = schema(R"({"type":"array","prefixItems":[{"type":"string","format":"date"},
      {"type":"string","format":"uuid"},{"type":"string","format":"date-time"}],"items":false})");
  EXPECT_TRUE(
      matches(formats,
              R"(["2024-02-29","123e4567-e89b-12d3-a456-426614174000","2024-01-01T10:20:30.5Z"])"));
  EXPECT_FALSE(matches(formats, R"(["2024-13-01","123e4567-e89b-12d3-a456-426614174000",)"
                                R"("2024-01-01T10:20:30Z"])"));

  auto rec = schema(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},
      "$ref":"#/$defs/node"})");
  EXPECT_TRUE(matches(rec, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]})"));
  EXPECT_FALSE(matches(rec, R"({"v":1,"kids":[{"w":2}]})"));

  auto any = compile(json_object_expr());
  EXPECT_TRUE(matches(any, R"({"a":[1,{"b":null}],"c":"d"})"));
  EXPECT_FALSE(matches(any, R"([1])"));
  EXPECT_FALSE(matches(any, R"({"a":[[[[[1]]]]]})"));  // deeper than free_depth
}

TEST(JsonSchemaGrammar, UnsupportedSchemasNameThePlace) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"({"type":"string","pattern":"a+"})", "schema.pattern"},
      {R"({"type":"object","properties":{"x":{"type":"number","multipleOf":2}}})",
       "schema.properties.x.multipleOf"},
      {R"({"type":"string","format":"hostname"})", "schema.format"},
      {R"({"type":"number","minimum":0.5})", "schema.minimum"},
      {R"({"$ref":"#/$defs/missing"})", "schema.$ref"},
      {R"({"type":"wat"})", "schema.type"},
      {R"({"type":"object","required":["x"]})", "schema.required"},
      {R"({"type":"array","uniqueItems":true})", "schema.uniqueItems"},
      {"[1]", "schema"},
      {"{", "schema"},
  };
  for (const auto& [s, where] : cases) {
    try {
      JsonSchema(s).value();
      ADD_FAILURE() << "accepted " << s;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
    }
  }
}

// A schema no value satisfies compiles to a grammar with no start, refused with a clear error
// (a matcher started on it read past its states).
TEST(JsonSchemaGrammar, SchemasAdmittingNoValueAreRefused) {
  // The last three admit no value only past their start: a required property (or a nested one)
  // of no value, an array of at least one item that admits none.
  for (const char* s :
       {"false", R"({"$ref":"#"})", R"({"anyOf":[false]})",
        R"({"properties":{"x":false},"required":["x"]})",
        R"({"properties":{"a":{"properties":{"x":false},"required":["x"]}},"required":["a"]})",
        R"({"type":"array","items":false,"minItems":1})"}) {
    try {
      compile(JsonSchema(s).value());
      ADD_FAILURE() << "accepted " << s;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("admits no value"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(compile(JsonSchema(R"({"anyOf":[false,{"type":"null"}]})").value()));
  // An optional property of no value is left out (no way into it is offered), and an array of
  // such items can only be empty.
  auto g = schema(R"({"properties":{"x":false,"y":{"type":"null"}}})");
  EXPECT_TRUE(matches(g, R"({"y":null})"));
  Matcher m(g);
  ASSERT_TRUE(m.accept('{') && m.accept('"'));
  EXPECT_FALSE((m.allowed()['x' / 64] >> ('x' % 64)) & 1);
  EXPECT_TRUE((m.allowed()['y' / 64] >> ('y' % 64)) & 1);
  auto a = schema(R"({"type":"array","items":false})");
  EXPECT_TRUE(matches(a, "[]"));
  EXPECT_FALSE(matches(a, "[null]"));
  // The expressions themselves: nothing in a sequence, an option, a list item or separator.
  EXPECT_FALSE(matches(compile(alt({seq({lit("a"), nothing()}), lit("b")})), "a"));
  EXPECT_TRUE(matches(compile(list(lit("a"), nothing(), 0, 5)), "a"));
  EXPECT_FALSE(matches(compile(list(lit("a"), nothing(), 0, 5)), "aa"));
  EXPECT_TRUE(matches(compile(members({{lit("A"), false}, {lit("B"), false}}, nothing())), "B"));
  EXPECT_FALSE(matches(compile(members({{lit("A"), false}, {lit("B"), false}}, nothing())), "AB"));
}

bool bit(const uint64_t* m, int32_t t) {
  return (m[t / 64] >> (t % 64)) & 1;
}

// allowed() computed the plain way: the tokens a copy of `m` accepts, each on its own.
std::vector<uint64_t> allowed_reference(const Matcher& m, const TokenVocab& vocab) {
  std::vector<uint64_t> bits(vocab.words(), 0);
  for (int32_t t = 0; t < vocab.size(); ++t) {
    Matcher copy = m;
    if (copy.accept(t)) bits[size_t(t) / 64] |= uint64_t(1) << (t % 64);
  }
  return bits;
}

// Random walks through the allowed tokens: the mask equals the plain per-token check at every
// step, every walk ends with EOS, and what it wrote matches the grammar.
TEST(Matcher, MaskEqualsPlainCheckAndWalksEnd) {
  const auto vocab = small_vocab();
  const std::vector<Expr> exprs = {
      JsonSchema(R"({"type":"object","properties":{"name":{"type":"string"},
          "age":{"type":"integer","minimum":-5,"maximum":120},"x":{"type":"number"},
          "l":{"type":"array","items":{"type":"boolean"}}},"required":["name","age"]})")
          .value(),
      json_object_expr(),
      seq({until("</think>"), json_object_expr()}),
      JsonSchema(R"({"enum":["red","green",3,null]})").value(),
  };
  std::mt19937 rng(1);
  for (size_t k = 0; k < exprs.size(); ++k) {
    auto g = Grammar::compile(exprs[k], vocab);
    for (int walk = 0; walk < 30; ++walk) {
      Matcher m(g);
      std::string text;
      int steps = 0;
      for (; steps < 3000; ++steps) {
        const uint64_t* mask = m.allowed();
        const std::vector<uint64_t> ref = allowed_reference(m, *vocab);
        ASSERT_EQ(std::vector<uint64_t>(mask, mask + vocab->words()), ref)
            << "expr " << k << " after " << text;
        std::vector<int32_t> ok;
        for (int32_t t = 0; t < vocab->size(); ++t)
          if (bit(mask, t)) ok.push_back(t);
        ASSERT_FALSE(ok.empty());
        // Favour EOS a little, as a model at the end of a value would.
        int32_t t = ok[rng() % ok.size()];
        if (bit(mask, 0) && rng() % 4 == 0) t = 0;
        ASSERT_TRUE(m.accept(t));
        if (t == 0) break;
        text += vocab->bytes(t);
      }
      ASSERT_LT(steps, 3000) << "expr " << k << " did not end: " << text.substr(0, 200);
      EXPECT_TRUE(matches(g, text)) << text;
      EXPECT_TRUE(m.finished());
    }
  }
}

TEST(Matcher, RefusesTokensOutsideTheGrammar) {
  const auto vocab = small_vocab();
  auto g = Grammar::compile(lit("true"), vocab);
  Matcher m(g);
  EXPECT_FALSE(m.accept(0));  // EOS before the end
  EXPECT_FALSE(m.accept('f'));
  EXPECT_FALSE(m.accept(vocab->size() - 1));  // never allowed
  EXPECT_TRUE(m.accept('t'));
  EXPECT_FALSE(m.complete());
  int32_t rue = -1;
  for (int32_t t = 0; t < vocab->size(); ++t)
    if (vocab->bytes(t) == "true") rue = t;
  ASSERT_GE(rue, 0);
  EXPECT_FALSE(m.accept(rue));  // "ttrue"
  EXPECT_TRUE(m.accept('r'));
  EXPECT_TRUE(m.accept('u'));
  EXPECT_TRUE(m.accept('e'));
  EXPECT_TRUE(m.complete());
  EXPECT_TRUE(m.finished());
  const uint64_t* mask = m.allowed();
  for (int32_t t = 1; t < vocab->size(); ++t) EXPECT_FALSE(bit(mask, t)) << t;
  EXPECT_TRUE(bit(mask, 0));
  EXPECT_TRUE(m.accept(0));
}

}  // namespace
}  // namespace deepinfer::grammar
