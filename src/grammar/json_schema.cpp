#include "grammar/json_schema.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/error.h"

namespace deepinfer::grammar {

namespace {

using Json = nlohmann::ordered_json;

constexpr int kIntDigits = 15;                // digits of an integer part
constexpr int kFracDigits = 15;               // digits of a fraction
constexpr int64_t kIntMax = 999999999999999;  // 15 nines
constexpr int32_t kMaxWhitespace = 16;        // longest run of JSON whitespace between tokens
constexpr int32_t kFreeDepth = 4;             // nesting of values a schema leaves free
constexpr int32_t kRefDepth = 6;              // expansions of one recursive $ref on a path

Expr ch(char c) {
  return byte_ranges({{uint8_t(c), uint8_t(c)}});
}
// One byte among `chars`.
Expr one_of(std::string_view chars) {
  std::vector<std::pair<uint8_t, uint8_t>> ranges;
  for (char c : chars) ranges.push_back({uint8_t(c), uint8_t(c)});
  return byte_ranges(std::move(ranges));
}
Expr digits(char lo, char hi) {
  return byte_ranges({{uint8_t(lo), uint8_t(hi)}});
}
Expr digit() {
  return digits('0', '9');
}
Expr optional(Expr e) {
  return alt({empty(), std::move(e)});
}

// One character of a JSON string's text: a plain one or an escape (\u escapes of surrogates
// excluded, which strict JSON parsers refuse when unpaired).
Expr json_string_char() {
  const Expr hex = byte_ranges({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
  const Expr u = seq(
      {ch('u'), alt({seq({byte_ranges({{'0', '9'}, {'a', 'c'}, {'A', 'C'}, {'e', 'f'}, {'E', 'F'}}),
                          hex, hex, hex}),
                     seq({one_of("dD"), digits('0', '7'), hex, hex})})});
  const Expr esc = seq({ch('\\'), alt({one_of("\"\\/bfnrt"), u})});
  std::string excluded = "\"\\";  // and the control characters
  for (char c = 0; c < 0x20; ++c) excluded += c;
  return alt({utf8_char(excluded), esc});
}

// Decimal numbers in [a, b] written with exactly `len` digits (leading zeros included).
Expr fixed_range(int64_t a, int64_t b, int len) {
  if (len == 1) return digits(char('0' + a), char('0' + b));
  int64_t p = 1;
  for (int i = 1; i < len; ++i) p *= 10;
  const int64_t da = a / p, db = b / p, ra = a % p, rb = b % p;
  if (da == db) return seq({ch(char('0' + da)), fixed_range(ra, rb, len - 1)});
  std::vector<Expr> parts;
  if (ra != 0) parts.push_back(seq({ch(char('0' + da)), fixed_range(ra, p - 1, len - 1)}));
  if (rb != p - 1) parts.push_back(seq({ch(char('0' + db)), fixed_range(0, rb, len - 1)}));
  // The leading digits followed by every remainder.
  const int64_t full_lo = da + (ra != 0), full_hi = db - (rb != p - 1);
  if (full_lo <= full_hi)
    parts.push_back(
        seq({digits(char('0' + full_lo), char('0' + full_hi)), repeat(digit(), len - 1, len - 1)}));
  return alt(std::move(parts));
}

// Decimal numbers in [lo, hi] (0 <= lo), without leading zeros.
Expr uint_range(int64_t lo, int64_t hi) {
  if (lo > hi) return nothing();
  if (lo == 0 && hi == kIntMax)
    return alt({ch('0'), seq({digits('1', '9'), repeat(digit(), 0, kIntDigits - 1)})});
  std::vector<Expr> parts;
  int64_t p = 1;  // 10^(len-1), the least number of len digits but for len = 1
  for (int len = 1; len == 1 || p <= hi; ++len, p *= 10) {
    const int64_t a = std::max(lo, len == 1 ? 0 : p), b = std::min(hi, p * 10 - 1);
    if (a <= b) parts.push_back(fixed_range(a, b, len));
  }
  return alt(std::move(parts));
}

// A bound of a numeric range: its value and whether it is excluded; none when absent.
struct Bound {
  bool present = false;
  int64_t value = 0;
  bool exclusive = false;
};

Expr any_fraction() {
  return seq({ch('.'), repeat(digit(), 1, kFracDigits)});
}
// Any number of at most 15 integer digits.
Expr any_number() {
  return seq({optional(ch('-')), uint_range(0, kIntMax), optional(any_fraction()),
              optional(seq({one_of("eE"), optional(one_of("+-")), repeat(digit(), 1, 3)}))});
}
Expr zero_fraction() {
  return seq({ch('.'), repeat(ch('0'), 1, kFracDigits)});
}
Expr nonzero_fraction() {
  return seq({ch('.'), repeat(ch('0'), 0, kFracDigits - 1), digits('1', '9'),
              repeat(digit(), 0, kFracDigits - 1)});
}

// Non-negative decimals m (integer part, optional fraction unless `integral`) with
// lo <= m <= hi (bounds inclusive or not; lo.value >= 0 and present).
Expr magnitude(Bound lo, Bound hi, bool integral) {
  if (integral && hi.present && !hi.exclusive) hi = {true, hi.value + 1, true};
  std::vector<Expr> parts;
  int64_t core_lo = lo.value;
  const int64_t top = hi.present ? hi.value : kIntMax + 1;
  if (lo.exclusive) {
    if (!integral && lo.value < top)
      parts.push_back(seq({uint_range(lo.value, lo.value), nonzero_fraction()}));
    core_lo = lo.value + 1;
  }
  const int64_t core_hi = std::min(top - 1, kIntMax);
  if (core_lo <= core_hi)
    parts.push_back(
        seq({uint_range(core_lo, core_hi), integral ? empty() : optional(any_fraction())}));
  if (hi.present && !hi.exclusive && hi.value >= core_lo)
    parts.push_back(seq({uint_range(hi.value, hi.value), optional(zero_fraction())}));
  return alt(std::move(parts));
}

struct Compiler {
  const Json& root;
  int32_t max_length;  // the largest minLength, maxLength, minItems or maxItems accepted
  Expr ws = repeat(one_of(" \t\n\r"), 0, kMaxWhitespace);  // JSON whitespace, bounded
  Expr sep = seq({ws, ch(','), ws});
  std::map<std::string, int> ref_depth = {};
  Expr free_cache[kFreeDepth + 1] = {};  // free_value(depth), once built

  Expr value(const Json& s, const std::string& path) {
    if (s.is_boolean()) return s.get<bool>() ? free_value(kFreeDepth) : nothing();
    if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
    check_keywords(s, path);
    if (const Json* r = field(s, "$ref")) return ref(*r, path);
    if (const Json* c = field(s, "const")) return lit(c->dump());
    if (const Json* e = field(s, "enum")) {
      if (!e->is_array() || e->empty()) fail(path + ".enum", "expected a non-empty array");
      std::vector<Expr> opts;
      for (const Json& v : *e) opts.push_back(lit(v.dump()));
      return alt(std::move(opts));
    }
    for (const char* k : {"anyOf", "oneOf"})
      if (const Json* a = field(s, k)) {
        if (!a->is_array() || a->empty()) fail(path + "." + k, "expected a non-empty array");
        std::vector<Expr> opts;
        for (size_t i = 0; i < a->size(); ++i)
          opts.push_back(value((*a)[i], str_cat(path, ".", k, "[", i, "]")));
        return with_null(s, alt(std::move(opts)));
      }
    if (const Json* a = field(s, "allOf")) {
      if (!a->is_array() || a->size() != 1)
        fail(path + ".allOf", "only an allOf of one schema is supported");
      return value((*a)[0], path + ".allOf[0]");
    }
    Json types = Json::array();  // the type names, one or a list
    if (const Json* t = field(s, "type")) {
      if (t->is_string()) types.push_back(*t);
      if (t->is_array()) types = *t;
      if (types.empty()) fail(path + ".type", "expected a type name or an array of them");
    } else if (field(s, "properties") || field(s, "additionalProperties") || field(s, "required")) {
      types.push_back("object");
    } else if (field(s, "items") || field(s, "prefixItems")) {
      types.push_back("array");
    } else {
      return with_null(s, free_value(kFreeDepth));
    }
    std::vector<Expr> opts;
    for (const Json& t : types) {
      if (!t.is_string()) fail(path + ".type", "expected type names");
      opts.push_back(typed(s, t.get<std::string>(), path));
    }
    return with_null(s, alt(std::move(opts)));
  }

  // The raw (unescaped) text of a string schema, for tool-call parameters: null for any text,
  // nullopt when `s` is not a plain string schema.
  std::optional<Expr> raw_string(const Json& s, const std::string& path) {
    if (!s.is_object()) return std::nullopt;
    if (const Json* e = field(s, "enum")) {
      std::vector<Expr> opts;
      if (!e->is_array() || e->empty()) return std::nullopt;
      for (const Json& v : *e) {
        if (!v.is_string()) return std::nullopt;
        opts.push_back(lit(v.get<std::string>()));
      }
      return alt(std::move(opts));
    }
    const Json* t = field(s, "type");
    if (!t || !t->is_string() || t->get<std::string>() != "string" || field(s, "anyOf") ||
        field(s, "oneOf") || field(s, "$ref") || field(s, "const") || field(s, "nullable"))
      return std::nullopt;
    if (const Json* f = field(s, "format")) return format(*f, path);
    const auto [min, max] = bounds(s, path, "minLength", "maxLength");
    if (min == 0 && max < 0) return Expr();
    return repeat(utf8_char("<"), min, max);
  }

  [[noreturn]] static void fail(const std::string& path, const std::string& what) {
    throw Error(str_cat(path, ": ", what));
  }

  static const Json* field(const Json& s, const char* key) {
    auto it = s.find(key);
    return it == s.end() ? nullptr : &*it;
  }
  // `v` is present and the boolean `b`.
  static bool is_bool(const Json* v, bool b) { return v && v->is_boolean() && v->get<bool>() == b; }

  void check_keywords(const Json& s, const std::string& path) {
    static const std::set<std::string> known = {
        "type", "enum", "const", "properties", "required", "additionalProperties", "items",
        "prefixItems", "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref", "$defs",
        "definitions", "nullable", "minLength", "maxLength", "format", "minimum", "maximum",
        "exclusiveMinimum", "exclusiveMaximum",
        // annotations
        "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
        "readOnly", "writeOnly", "strict", "name", "propertyOrdering", "contentEncoding",
        "contentMediaType", "unevaluatedProperties"};
    for (const auto& [key, v] : s.items())
      if (!known.contains(key))
        fail(str_cat(path, ".", key),
             "this schema keyword is not supported for constrained output");
    // unevaluatedProperties false is what strict schemas say anyway; anything else constrains.
    if (const Json* u = field(s, "unevaluatedProperties"); u && !is_bool(u, false))
      fail(path + ".unevaluatedProperties", "only false is supported");
  }

  // `open` ws body ws `close`, the body (and its ws) possibly absent when `optional_body`.
  Expr enclose(char open, Expr body, bool optional_body, char close) {
    const Expr inner = seq({std::move(body), ws});
    return seq({ch(open), ws, optional_body ? optional(inner) : inner, ch(close)});
  }
  // An object member: key ws ':' ws value.
  Expr member(Expr key, Expr value) {
    return seq({std::move(key), ws, ch(':'), ws, std::move(value)});
  }

  Expr with_null(const Json& s, Expr e) {
    return is_bool(field(s, "nullable"), true) ? alt({std::move(e), lit("null")}) : e;
  }

  Expr ref(const Json& r, const std::string& path) {
    if (!r.is_string()) fail(path + ".$ref", "expected a string");
    const std::string target = r.get<std::string>();
    const Json* s = target == "#" ? &root : nullptr;
    for (const char* key : {"$defs", "definitions"}) {
      const std::string prefix = str_cat("#/", key, "/");
      const Json* defs = field(root, key);
      if (target.starts_with(prefix) && defs && defs->is_object())
        s = field(*defs, target.substr(prefix.size()).c_str());
    }
    if (!s)
      fail(path + ".$ref",
           str_cat("'", target, "' does not name a schema under #/$defs or #/definitions"));
    int& depth = ref_depth[target];
    if (depth >= kRefDepth) return nothing();
    ++depth;
    Expr e = value(*s, target);
    --depth;
    return e;
  }

  Expr typed(const Json& s, const std::string& t, const std::string& path) {
    if (t == "string") return json_string(s, path);
    if (t == "integer" || t == "number") return numeric(s, path, t == "integer");
    if (t == "boolean") return alt({lit("true"), lit("false")});
    if (t == "null") return lit("null");
    if (t == "object") return object(s, path);
    if (t == "array") return array(s, path);
    fail(path + ".type", str_cat("unknown type '", t, "'"));
  }

  std::pair<int32_t, int32_t> bounds(const Json& s, const std::string& path, const char* lo_key,
                                     const char* hi_key) {
    const auto get = [&](const char* key, int32_t absent) {
      const Json* v = field(s, key);
      if (!v) return absent;
      if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > max_length)
        fail(str_cat(path, ".", key), str_cat("expected an integer in [0, ", max_length, "]"));
      return int32_t(v->get<int64_t>());
    };
    const int32_t lo = get(lo_key, 0), hi = get(hi_key, -1);
    if (hi >= 0 && hi < lo) fail(path, str_cat(hi_key, " is below ", lo_key));
    return {lo, hi};
  }

  Expr json_string(const Json& s, const std::string& path) {
    if (const Json* f = field(s, "format")) return seq({ch('"'), format(*f, path), ch('"')});
    const auto [min, max] = bounds(s, path, "minLength", "maxLength");
    return seq({ch('"'), repeat(json_string_char(), min, max), ch('"')});
  }

  // The text of a string format (no quotes, none of its characters needs escaping).
  Expr format(const Json& f, const std::string& path) {
    if (!f.is_string()) fail(path + ".format", "expected a string");
    const std::string name = f.get<std::string>();
    const Expr date = seq(
        {repeat(digit(), 4, 4), ch('-'), fixed_range(1, 12, 2), ch('-'), fixed_range(1, 31, 2)});
    const Expr time =
        seq({fixed_range(0, 23, 2), ch(':'), fixed_range(0, 59, 2), ch(':'), fixed_range(0, 59, 2),
             optional(seq({ch('.'), repeat(digit(), 1, 6)})),
             alt({ch('Z'),
                  seq({one_of("+-"), fixed_range(0, 23, 2), ch(':'), fixed_range(0, 59, 2)})})});
    if (name == "date") return date;
    if (name == "time") return time;
    if (name == "date-time") return seq({date, ch('T'), time});
    if (name == "uuid") {
      const Expr hex = byte_ranges({{'0', '9'}, {'a', 'f'}});
      return seq({repeat(hex, 8, 8), ch('-'), repeat(hex, 4, 4), ch('-'), repeat(hex, 4, 4),
                  ch('-'), repeat(hex, 4, 4), ch('-'), repeat(hex, 12, 12)});
    }
    if (name == "ipv4") {
      const Expr octet = uint_range(0, 255);
      return seq({octet, ch('.'), octet, ch('.'), octet, ch('.'), octet});
    }
    if (name == "email") {
      const Expr local =
          byte_ranges({{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'_', '_'}, {'+', '+'}, {'-', '-'}});
      const Expr alnum = byte_ranges({{'a', 'z'}, {'A', 'Z'}, {'0', '9'}});
      const Expr label = seq(
          {alnum, repeat(byte_ranges({{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'-', '-'}}), 0, 15)});
      return seq({list(repeat(local, 1, 32), ch('.'), 1, 3), ch('@'),
                  repeat(seq({label, ch('.')}), 1, 3),
                  repeat(byte_ranges({{'a', 'z'}, {'A', 'Z'}}), 2, 6)});
    }
    fail(path + ".format", str_cat("the string format '", name,
                                   "' is not supported (date, time, date-time, uuid, ipv4, email "
                                   "are)"));
  }

  // Bounds of a numeric schema as (lo, hi) in the value's own type: integer bounds round inward;
  // number bounds must be integral.
  std::pair<Bound, Bound> range(const Json& s, const std::string& path, bool integral) {
    Bound lo, hi;
    auto read = [&](const char* key, bool upper, bool exclusive) {
      const Json* v = field(s, key);
      // Draft 4 spells exclusivity as a boolean beside minimum/maximum.
      if (!v || v->is_boolean()) return;
      const std::string where = str_cat(path, ".", key);
      if (!v->is_number()) fail(where, "expected a number");
      const double x = v->get<double>();
      if (!std::isfinite(x)) fail(where, "expected a finite number");
      // Values have at most 15 integer digits: a bound beyond that is no bound, or none is left.
      if (upper ? x > double(kIntMax) : x < -double(kIntMax)) return;
      if (upper ? x < -double(kIntMax) : x > double(kIntMax))
        fail(where, "no value of at most 15 digits meets the bound");
      if (!integral && x != std::floor(x))
        fail(where, "number bounds with a fraction are not supported (integral ones are)");
      // Integer bounds are rounded inward, exclusive ones made inclusive.
      double y = upper ? std::floor(x) : std::ceil(x);
      if (integral && exclusive && y == x) y += upper ? -1 : 1;
      const Bound b{true, int64_t(y), exclusive && !integral};
      Bound& slot = upper ? hi : lo;
      // The tighter of minimum and exclusiveMinimum (or the maxima).
      const bool tighter = !slot.present || (upper ? b.value < slot.value : b.value > slot.value) ||
                           (b.value == slot.value && b.exclusive);
      if (tighter) slot = b;
    };
    read("minimum", false, is_bool(field(s, "exclusiveMinimum"), true));
    read("maximum", true, is_bool(field(s, "exclusiveMaximum"), true));
    read("exclusiveMinimum", false, true);
    read("exclusiveMaximum", true, true);
    return {lo, hi};
  }

  // An integer or number schema (integer bounds are inclusive, see range()).
  Expr numeric(const Json& s, const std::string& path, bool integral) {
    const auto [lo, hi] = range(s, path, integral);
    if (!integral && !lo.present && !hi.present) return any_number();
    if (lo.present && hi.present &&
        (lo.value > hi.value || (lo.value == hi.value && (lo.exclusive || hi.exclusive))))
      fail(path, integral ? "the bounds leave no integer" : "the bounds leave no number");
    std::vector<Expr> parts;
    // v >= 0: lo' = max(lo, 0) (0 inclusive when lo < 0).
    if (!hi.present || hi.value > 0 || (hi.value == 0 && !hi.exclusive))
      parts.push_back(
          magnitude(lo.present && lo.value >= 0 ? lo : Bound{true, 0, false}, hi, integral));
    // v < 0 as '-' m: m in [max(-hi, 0), -lo], the bounds' exclusivity swapped over.
    if (!lo.present || lo.value < 0) {
      const Bound mlo =
          hi.present && hi.value < 0 ? Bound{true, -hi.value, hi.exclusive} : Bound{true, 0, true};
      const Bound mhi = lo.present ? Bound{true, -lo.value, lo.exclusive} : Bound{};
      parts.push_back(seq({ch('-'), magnitude(mlo, mhi, integral)}));
    }
    return alt(std::move(parts));
  }

  // check_keywords has refused what constrains an object or array beyond what is read here
  // (minProperties, patternProperties, uniqueItems, contains, ...).
  Expr object(const Json& s, const std::string& path) {
    const Json* props = field(s, "properties");
    if (props && !props->is_object()) fail(path + ".properties", "expected an object");
    std::set<std::string> required;
    if (const Json* r = field(s, "required")) {
      if (!r->is_array()) fail(path + ".required", "expected an array of names");
      for (const Json& n : *r) {
        if (!n.is_string()) fail(path + ".required", "expected an array of names");
        if (!props || !props->contains(n.get<std::string>()))
          fail(path + ".required",
               str_cat("'", n.get<std::string>(), "' is required but not among the properties"));
        required.insert(n.get<std::string>());
      }
    }
    if (!props || props->empty()) {
      // A map: keys free, values after additionalProperties (absent or true: any value).
      const Json* add = field(s, "additionalProperties");
      if (is_bool(add, false)) return seq({ch('{'), ws, ch('}')});
      const Expr v = add && !add->is_boolean() ? value(*add, path + ".additionalProperties")
                                               : free_value(kFreeDepth);
      return enclose('{', list(member(free_string(), v), sep, 0, -1), true, '}');
    }
    std::vector<Member> ms;
    for (const auto& [key, schema] : props->items()) {
      const Expr v = value(schema, str_cat(path, ".properties.", key));
      ms.push_back({member(lit(Json(key).dump()), v), required.contains(key)});
    }
    return enclose('{', members(std::move(ms), sep), false, '}');
  }

  Expr array(const Json& s, const std::string& path) {
    const auto [min, max] = bounds(s, path, "minItems", "maxItems");
    // The further items: any value when "items" is absent, none when it is false.
    const Json* items = field(s, "items");
    const Expr item = !items                  ? free_value(kFreeDepth)
                      : is_bool(items, false) ? nothing()
                                              : value(*items, path + ".items");
    if (const Json* pre = field(s, "prefixItems")) {
      if (!pre->is_array() || pre->empty())
        fail(path + ".prefixItems", "expected a non-empty array");
      // The tuple's members all, then the further items the bounds allow.
      std::vector<Expr> parts;
      for (size_t i = 0; i < pre->size(); ++i) {
        if (i) parts.push_back(sep);
        parts.push_back(value((*pre)[i], str_cat(path, ".prefixItems[", i, "]")));
      }
      const int32_t n = int32_t(pre->size());
      if (max < 0 || max > n)
        parts.push_back(repeat(seq({sep, item}), std::max(0, min - n), max < 0 ? -1 : max - n));
      return enclose('[', seq(std::move(parts)), false, ']');
    }
    return enclose('[', list(item, sep, std::max(min, 1), max), min == 0, ']');
  }

  Expr free_string() { return seq({ch('"'), repeat(json_string_char(), 0, -1), ch('"')}); }

  // Any JSON value, containers nesting at most `depth` deep.
  Expr free_value(int32_t depth) {
    if (free_cache[size_t(depth)]) return free_cache[size_t(depth)];
    std::vector<Expr> opts{free_string(), any_number(), lit("true"), lit("false"), lit("null")};
    if (depth > 0) {
      opts.push_back(free_object(depth));
      opts.push_back(enclose('[', list(free_value(depth - 1), sep, 1, -1), true, ']'));
    }
    return free_cache[size_t(depth)] = alt(std::move(opts));
  }
  Expr free_object(int32_t depth) {
    return enclose('{', list(member(free_string(), free_value(depth - 1)), sep, 1, -1), true, '}');
  }
};

}  // namespace

struct JsonSchema::Impl {
  Json root;
  int32_t max_length;
};

JsonSchema::JsonSchema(std::string_view schema_json, int32_t max_length)
    : impl_(new Impl{Json::parse(schema_json, nullptr, /*allow_exceptions=*/false), max_length}) {
  if (impl_->root.is_discarded()) throw Error("schema: not valid JSON");
  if (!impl_->root.is_object() && !impl_->root.is_boolean())
    throw Error("schema: expected a JSON object");
}

JsonSchema::~JsonSchema() = default;

Expr JsonSchema::value() const {
  return Compiler{impl_->root, impl_->max_length}.value(impl_->root, "schema");
}

std::vector<JsonSchema::Property> JsonSchema::properties() const {
  const Json& root = impl_->root;
  if (!root.is_object()) return {};
  if (root.contains("$ref")) throw Error("schema: expected properties, not a $ref");
  const auto p = root.find("properties");
  if (p == root.end()) return {};
  if (!p->is_object()) throw Error("schema.properties: expected an object");
  std::set<std::string> required;
  if (auto r = root.find("required"); r != root.end() && r->is_array())
    for (const Json& n : *r)
      if (n.is_string()) required.insert(n.get<std::string>());
  Compiler c{root, impl_->max_length};
  std::vector<Property> out;
  for (const auto& [name, schema] : p->items()) {
    const std::string path = "schema.properties." + name;
    Expr json = c.value(schema, path);
    const std::optional<Expr> raw = c.raw_string(schema, path);
    out.push_back(
        {name, required.contains(name), std::move(json), raw.has_value(), raw.value_or(nullptr)});
  }
  return out;
}

Expr json_object_expr() {
  return Compiler{Json::object(), /*max_length=*/0}.free_object(kFreeDepth);
}

}  // namespace deepinfer::grammar
