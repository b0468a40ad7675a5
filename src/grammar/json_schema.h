// JSON Schema -> grammar expression: the JSON texts that are valid against a schema, as a
// regular language the Matcher can enforce token by token (grammar.h).
//
// Supported: type (one or a list), enum, const, properties (emitted in the schema's order;
// required ones always, optional ones possibly), additionalProperties (a map of values when
// no properties are declared), items, prefixItems, minItems/maxItems, anyOf/oneOf, allOf with
// one member, $ref into $defs/definitions (or "#"), nullable, minLength/maxLength, the string
// formats date, time, date-time, uuid, ipv4 and email, and for integers and numbers
// minimum/maximum/exclusiveMinimum/exclusiveMaximum (numbers: integral bounds). Annotations
// (title, description, default, examples, $schema, ...) are ignored. Anything else that
// constrains a value (pattern, multipleOf, minProperties, uniqueItems, not, if/then, ...) is
// refused with an error naming where it is.
//
// What keeps a constrained output finite: whitespace runs between tokens are at most 16 long,
// integers have at most 15 digits, fractions 15, exponents 3; values a schema leaves free ({} or
// true) nest at most 4 deep and a recursive $ref expands at most 6 times on a path. Beyond those
// depths only what closes the value is left. minLength, maxLength, minItems and maxItems are at
// most `max_length`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace deepinfer::grammar {

// A schema (JSON text) compiled to expressions. Throws deepinfer::Error for invalid JSON, a
// schema that is not one, or what is not supported; the message names the place
// ("schema.properties.age.minimum").
class JsonSchema {
 public:
  explicit JsonSchema(std::string_view schema_json, int32_t max_length = 8192);
  ~JsonSchema();

  // The JSON texts valid against the schema (no whitespace around the value).
  Expr value() const;

  // For the root's properties one by one (tool-call parameters): requires an object schema.
  struct Property {
    std::string name;
    bool required = false;
    Expr json;            // the value as JSON text
    bool string = false;  // the schema allows only strings (tool calls pass those raw)
    Expr raw;             // string: the raw text allowed; null: any text
  };
  std::vector<Property> properties() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Any JSON object (the "json_object" response format), nesting bounded like a free value's.
Expr json_object_expr();

}  // namespace deepinfer::grammar
