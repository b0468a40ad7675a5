#include "server/json_fields.h"

#include "tokenizer/py_json.h"

#include <cmath>
#include <limits>

namespace deepinfer::server {

namespace {

// Deeper bodies are refused before parsing: the parser copes, but dumping and destroying nested
// values recurses, and no legitimate request nests this deep.
constexpr int kMaxNesting = 64;

const char* type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    case Json::value_t::number_float:
      return "a decimal number";
    case Json::value_t::binary:
      return "an integer beyond 64 bits";
    default:
      return "an unsupported value";
  }
}

}  // namespace

std::string ApiError::default_type(int status) {
  if (status == 401) return "authentication_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

std::string error_body(const ApiError& e) {
  Json err = {{"message", e.what()},
              {"type", e.type},
              {"param", e.param.empty() ? Json() : Json(e.param)},
              {"code", e.code.empty() ? Json() : Json(e.code)}};
  return dump_json(Json{{"error", std::move(err)}});
}

std::string dump_json(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

int json_nesting_depth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

Json parse_body(std::string_view body) {
  if (json_nesting_depth(body) > kMaxNesting)
    throw ApiError(400, str_cat("The request body nests deeper than ", kMaxNesting, " levels."), {},
                   "invalid_json");
  // Integers beyond 64 bits keep their digits (tool schemas and arguments are rendered into the
  // prompt as Python writes them).
  Json j = tokenizer_internal::parse_json_exact(body);
  if (j.is_discarded()) {
    std::string what;
    try {
      (void)Json::parse(body);  // for the library's description of where and why
    } catch (const Json::exception& e) {
      // Drop the library's "[json.exception.parse_error.101] " prefix; keep where and why.
      what = e.what();
      if (const size_t at = what.find("] "); at != std::string::npos) what.erase(0, at + 2);
    }
    throw ApiError(400, "The request body is not valid JSON: " + what, {}, "invalid_json");
  }
  if (!j.is_object())
    throw ApiError(400, str_cat("The request body must be a JSON object, not ", type_name(j), "."),
                   {}, "invalid_json");
  return j;
}

const Json* find_field(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

void throw_bad_type(const std::string& name, const char* expected, const Json& got) {
  throw ApiError(400,
                 str_cat("Invalid type for '", name, "': expected ", expected, ", but got ",
                         type_name(got), "."),
                 name, "invalid_type");
}

void throw_bad_value(const std::string& name, const std::string& what) {
  throw ApiError(400, str_cat("Invalid value for '", name, "': ", what), name, "invalid_value");
}

std::string get_string(const Json& v, const std::string& name) {
  if (!v.is_string()) throw_bad_type(name, "a string", v);
  return v.get<std::string>();
}

bool get_bool(const Json& v, const std::string& name) {
  if (!v.is_boolean()) throw_bad_type(name, "a boolean", v);
  return v.get<bool>();
}

int64_t get_int(const Json& v, const std::string& name, int64_t lo, int64_t hi) {
  bool in_range = false;
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    in_range = u <= uint64_t(std::numeric_limits<int64_t>::max());
    x = in_range ? int64_t(u) : 0;
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
    in_range = true;
  } else {
    throw_bad_type(name, "an integer", v);
  }
  if (!in_range || x < lo || x > hi)
    throw_bad_value(name,
                    str_cat("expected an integer in [", lo, ", ", hi, "], got ", v.dump(), "."));
  return x;
}

double get_number(const Json& v, const std::string& name, double lo, double hi) {
  if (!v.is_number()) throw_bad_type(name, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw_bad_value(name,
                    str_cat("expected a number in [", lo, ", ", hi, "], got ", v.dump(), "."));
  return x;
}

int32_t get_token_id(const Json& v, const std::string& name, int64_t vocab) {
  if (!v.is_number_integer()) throw_bad_type(name, "an integer token id", v);
  const bool ok = v.is_number_unsigned() ? v.get<uint64_t>() < uint64_t(vocab)
                                         : v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab;
  if (!ok)
    throw_bad_value(name, str_cat(v.dump(), " is not a token id of this model (the vocabulary has ",
                                  vocab, " tokens)."));
  return int32_t(v.get<int64_t>());
}

}  // namespace deepinfer::server
