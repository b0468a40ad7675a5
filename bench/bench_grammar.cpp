#include "bench_grammar.h"

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::bench {

namespace {

constexpr const char* kDefaultSchema = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":40},
  "age":{"type":"integer","minimum":0,"maximum":150},
  "email":{"type":"string","format":"email"},
  "tags":{"type":"array","items":{"type":"string","maxLength":16},"maxItems":5},
  "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
    "zip":{"type":"string","maxLength":10}},"required":["street","city"]},
  "role":{"enum":["admin","user","guest"]},
  "score":{"type":"number","minimum":0,"maximum":100},
  "active":{"type":"boolean"}},
  "required":["name","age","tags","address","role","active"]})";

struct Walks {
  std::vector<double> step_us;  // allowed() + accept() per step
  int64_t tokens = 0, ended = 0;
};

// Random walks: a token drawn uniformly from the allowed ones (EOS once allowed, half the time).
Walks walk(const std::shared_ptr<const grammar::Grammar>& g, int walks, int max_steps,
           uint64_t seed) {
  Walks w;
  std::mt19937_64 rng(seed);
  const grammar::TokenVocab& v = g->vocab();
  std::vector<int32_t> ok;
  for (int i = 0; i < walks; ++i) {
    grammar::Matcher m(g);
    for (int s = 0; s < max_steps; ++s) {
      const double t0 = now_s();
      const uint64_t* mask = m.allowed();
      const double t1 = now_s();
      ok.clear();
      for (int32_t t = 0; t < v.size(); ++t)
        if ((mask[t / 64] >> (t % 64)) & 1) ok.push_back(t);
      const bool eos = (mask[v.eos() / 64] >> (v.eos() % 64)) & 1;
      const int32_t tok = eos && rng() % 2 ? v.eos() : ok[rng() % ok.size()];
      const double t2 = now_s();
      DI_CHECK(m.accept(tok), "the walk chose a refused token");
      const double t3 = now_s();
      w.step_us.push_back(((t1 - t0) + (t3 - t2)) * 1e6);
      ++w.tokens;
      if (tok == v.eos() || m.finished()) {
        ++w.ended;
        break;
      }
    }
  }
  return w;
}

double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

}  // namespace

void bench_grammar(Reporter& rep, const GrammarBenchOptions& opt) {
  DI_REQUIRE(!opt.tokenizer.empty(), "bench grammar needs --tokenizer");
  auto tok = Tokenizer::load(opt.tokenizer);
  std::string schema = kDefaultSchema;
  if (!opt.schema_file.empty()) {
    std::ifstream f(opt.schema_file);
    DI_REQUIRE(f, "cannot read ", opt.schema_file);
    std::stringstream ss;
    ss << f.rdbuf();
    schema = ss.str();
  }
  const double t0 = now_s();
  auto vocab = server::make_grammar_vocab(*tok, tok->vocab_size(), tok->eos_id());
  const double t1 = now_s();
  rep.note(str_cat("vocabulary ", vocab->size(), " tokens, trie of ", vocab->nodes().size(),
                   " nodes built in ", (t1 - t0) * 1e3, " ms"));
  server::OutputShape shape;
  shape.kind = server::OutputShape::Kind::kJsonSchema;
  shape.schema_json = schema;
  for (const bool json_object : {false, true}) {
    shape.kind = json_object ? server::OutputShape::Kind::kJsonObject
                             : server::OutputShape::Kind::kJsonSchema;
    const double c0 = now_s();
    auto g = grammar::Grammar::compile(server::output_shape_expr(shape), vocab);
    const double c1 = now_s();
    const Walks cold = walk(g, opt.walks, opt.max_steps, 1);
    const Walks warm = walk(g, opt.walks, opt.max_steps, 1);  // the same walks again
    for (const auto& [phase, w] : {std::pair<const char*, const Walks&>{"cold", cold},
                                   std::pair<const char*, const Walks&>{"warm", warm}}) {
      double sum = 0;
      for (double x : w.step_us) sum += x;
      Row r("grammar");
      r.add("format", json_object ? "json_object" : "json_schema")
          .add("phase", phase)
          .add("states", int64_t(g->num_states()))
          .add("compile_ms", (c1 - c0) * 1e3)
          .add("steps", w.tokens)
          .add("walks_ended", w.ended)
          .add("mean_us", sum / double(std::max<size_t>(1, w.step_us.size())))
          .add("p50_us", pct(w.step_us, 0.5))
          .add("p99_us", pct(w.step_us, 0.99))
          .add("max_us", pct(w.step_us, 1.0));
      rep.print(r);
    }
  }
}

}  // namespace deepinfer::bench
