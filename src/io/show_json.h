// A JSON value as error messages in src/io quote it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace deepinfer {

// Scalars as written (cut at 80 characters), arrays with up to 8 entries; nested containers
// are only named: dump() recurses once per nesting level, and a hostile file can nest millions
// of levels deep.
inline std::string show_json(const nlohmann::json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i == 8) return s + ", ...]";
      s += (i ? ", " : "") +
           (v[i].is_structured() ? std::string("an ") + v[i].type_name() : show_json(v[i]));
    }
    return s + "]";
  }
  std::string s = v.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

}  // namespace deepinfer
