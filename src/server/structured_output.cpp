#include "server/structured_output.h"

#include <algorithm>

#include "core/error.h"
#include "grammar/json_schema.h"
#include "ranks/serial.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::server {

namespace cf = chat_format;
using namespace grammar;

std::shared_ptr<const TokenVocab> make_grammar_vocab(const Tokenizer& tok, int64_t vocab_size,
                                                     int32_t eos_id) {
  const std::vector<int32_t> markers = chat_marker_tokens(tok);
  std::vector<std::string> bytes(static_cast<size_t>(vocab_size));
  for (int32_t id = 0; id < int32_t(vocab_size) && id < tok.id_limit(); ++id)
    if (!tok.is_special(id) || std::ranges::binary_search(markers, id))
      bytes[size_t(id)] = tok.token_bytes(id);
  return std::make_shared<TokenVocab>(std::move(bytes), eos_id);
}

namespace {

// <｜DSML｜ parameter name="k" string="true|false">value</｜DSML｜ parameter>\n
Expr tool_parameter(const JsonSchema::Property& p) {
  const std::string open = str_cat(cf::kParamOpen, " name=\"", p.name, "\" string=\"");
  const Expr close = lit(str_cat(cf::kParamClose, "\n"));
  if (p.string) {
    if (!p.raw) return seq({lit(open + "true\">"), until(std::string(cf::kParamClose)), lit("\n")});
    return seq({lit(open + "true\">"), p.raw, close});
  }
  return seq({lit(open + "false\">"), p.json, close});
}

Expr tool_invoke(const ToolSpec& t) {
  std::vector<Member> params;
  if (!t.parameters_json.empty()) {
    try {
      for (const JsonSchema::Property& p : JsonSchema(t.parameters_json).properties())
        params.push_back({tool_parameter(p), p.required});
    } catch (const Error& e) {
      throw Error(str_cat("tool '", t.name, "' parameters: ", e.what()));
    }
  }
  return seq({lit(str_cat(cf::kInvokeOpen, " name=\"", t.name, "\">\n")),
              members(std::move(params), empty()), lit(cf::kInvokeClose)});
}

}  // namespace

Expr output_shape_expr(const OutputShape& s) {
  Expr body;
  if (s.kind == OutputShape::Kind::kFree) return nullptr;
  if (s.kind == OutputShape::Kind::kJsonObject) body = json_object_expr();
  if (s.kind == OutputShape::Kind::kJsonSchema) body = JsonSchema(s.schema_json).value();
  if (s.kind == OutputShape::Kind::kToolCalls) {
    DI_REQUIRE(!s.tools.empty(), "a tool call needs tools to call");
    std::vector<Expr> invokes;
    for (const ToolSpec& t : s.tools) invokes.push_back(tool_invoke(t));
    body = seq({lit(str_cat(cf::kCallsStart, ">\n")),
                list(alt(std::move(invokes)), lit("\n"), 1, s.parallel_tool_calls ? 16 : 1),
                lit(str_cat("\n", cf::kCallsClose))});
  }
  return s.after_thinking ? seq({until(std::string(cf::kThinkEnd)), body}) : body;
}

std::string encode_output_shape(const OutputShape& s) {
  ranks::Writer w;
  w.put<uint8_t>(uint8_t(s.kind));
  w.put<uint8_t>(s.parallel_tool_calls);
  w.put<uint8_t>(s.after_thinking);
  w.put_string(s.schema_json);
  w.put<uint64_t>(s.tools.size());
  for (const ToolSpec& t : s.tools) {
    w.put_string(t.name);
    w.put_string(t.parameters_json);
  }
  const std::vector<uint8_t>& b = w.bytes();
  return std::string(b.begin(), b.end());
}

OutputShape decode_output_shape(std::string_view bytes) {
  ranks::Reader r({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "output shape");
  OutputShape s;
  const auto kind = r.get<uint8_t>();
  DI_REQUIRE(kind <= uint8_t(OutputShape::Kind::kToolCalls), "output shape: kind ", int(kind),
             " is unknown");
  s.kind = OutputShape::Kind(kind);
  s.parallel_tool_calls = r.get<uint8_t>() != 0;
  s.after_thinking = r.get<uint8_t>() != 0;
  s.schema_json = r.get_string();
  const auto n = r.get<uint64_t>();
  DI_REQUIRE(n <= r.remaining() / 16, "output shape: ", n, " tools in ", r.remaining(), " bytes");
  // A braced list is evaluated in order: the name, then the parameters.
  for (uint64_t i = 0; i < n; ++i) s.tools.push_back({r.get_string(), r.get_string()});
  r.expect_end();
  return s;
}

std::shared_ptr<const Grammar> GrammarCache::find(const std::string& key) {
  const auto it = std::ranges::find(lru_, key, &decltype(lru_)::value_type::first);
  if (it == lru_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it);
  return it->second;
}

std::shared_ptr<const Grammar> GrammarCache::get(const OutputShape& s) {
  if (s.kind == OutputShape::Kind::kFree) return nullptr;
  std::string key = encode_output_shape(s);
  std::unique_lock lk(mu_);
  if (auto g = find(key)) return g;
  lk.unlock();
  // Compiled outside the lock (a large schema takes a while); a race compiles it twice.
  std::shared_ptr<const Grammar> g = Grammar::compile(output_shape_expr(s), vocab_);
  lk.lock();
  if (auto found = find(key)) return found;
  lru_.emplace_front(std::move(key), g);
  if (lru_.size() > kCapacity) lru_.pop_back();
  return g;
}

}  // namespace deepinfer::server
