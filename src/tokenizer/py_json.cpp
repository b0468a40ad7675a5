#include "tokenizer/py_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace deepinfer::tokenizer_internal {

namespace {

// Null, booleans, integers and strings, spelled as Python spells them (strings with the short
// escapes and \u00xx for other control characters; an ill-formed UTF-8 sequence, which a Python
// string cannot hold, becomes U+FFFD).
std::string scalar(const nlohmann::ordered_json& v) {
  return v.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// Python's float repr: the shortest digits that round-trip, written in positional notation
// when the decimal point falls within (-4, 16] digits of the first digit, else as d.ddde+XX
// (which is how to_chars writes scientific notation too).
void py_float(double v, std::string& out) {
  if (!std::isfinite(v)) {
    out += std::isnan(v) ? "NaN" : v < 0 ? "-Infinity" : "Infinity";
    return;
  }
  char buf[64] = {};  // zeros: the exponent text ends there
  char* end = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific).ptr;
  const int exp10 = std::atoi(std::find(buf, end, 'e') + 1);
  if (exp10 >= -4 && exp10 < 16) {
    end = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed).ptr;
    if (std::find(buf, end, '.') == end) end = std::copy_n(".0", 2, end);
  }
  out.append(buf, end);
}

void dump(const nlohmann::ordered_json& v, std::string& out) {
  if (v.is_number_float()) return py_float(v.get<double>(), out);
  if (v.is_structured()) {
    const bool object = v.is_object();
    out.push_back(object ? '{' : '[');
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it != v.begin()) out += ", ";
      if (object) out += scalar(it.key()) + ": ";
      dump(it.value(), out);
    }
    out.push_back(object ? '}' : ']');
  } else if (v.is_binary()) {
    // An integer's digits; no other binary value comes from parsing text.
    const auto& digits = v.get_binary();
    if (digits.has_subtype() && digits.subtype() == kBigIntSubtype)
      out.append(digits.begin(), digits.end());
    else
      out += "null";
  } else {
    // Null, booleans, integers and strings; a discarded value (never the result of parsing
    // text) as null.
    out += v.is_discarded() ? "null" : scalar(v);
  }
}

// nlohmann's own DOM builder, except that integers too large for 64 bits (which the lexer
// reports as floats, with their text) become digit strings.
class ExactBuilder : public nlohmann::detail::json_sax_dom_parser<nlohmann::ordered_json> {
 public:
  using json_sax_dom_parser::json_sax_dom_parser;
  bool number_float(number_float_t v, const string_t& text) {
    if (text.find_first_of(".eE") != std::string::npos)
      return json_sax_dom_parser::number_float(v, text);
    binary_t digits(std::vector<uint8_t>(text.begin(), text.end()), kBigIntSubtype);
    return binary(digits);
  }
};

}  // namespace

nlohmann::ordered_json parse_json_exact(std::string_view text) {
  nlohmann::ordered_json root;
  ExactBuilder b(root, /*allow_exceptions=*/false);
  if (!nlohmann::ordered_json::sax_parse(text, &b))
    return nlohmann::ordered_json::value_t::discarded;
  return root;
}

std::string py_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump(value, out);
  return out;
}

}  // namespace deepinfer::tokenizer_internal
