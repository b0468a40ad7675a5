// JSON text as Python's json.dumps(value, ensure_ascii=False) writes it: ", " and ": "
// separators, keys in their original order, non-ASCII characters unescaped, floats in Python's
// repr (shortest round-trip digits; exponent form below 1e-4 and from 1e16 up). The chat
// format embeds such text in prompts, so every byte matters.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace deepinfer::tokenizer_internal {

std::string py_json_dumps(const nlohmann::ordered_json& value);

// Parses JSON text keeping what Python's json.loads keeps and nlohmann's parser would round:
// integers beyond 64 bits are held as their digits (a binary value of subtype kBigIntSubtype),
// which py_json_dumps writes back unchanged. Returns a discarded value for invalid text.
constexpr uint8_t kBigIntSubtype = 'I';
nlohmann::ordered_json parse_json_exact(std::string_view text);

}  // namespace deepinfer::tokenizer_internal
