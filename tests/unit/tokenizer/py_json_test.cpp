// JSON as Python writes it, and parsing that keeps what Python keeps: integers of any size exactly
// (nlohmann alone would round those beyond 64 bits to doubles), floats in repr spelling.
#include <gtest/gtest.h>

#include "tokenizer/py_json.h"

namespace deepinfer {
namespace {

using tokenizer_internal::parse_json_exact;
using tokenizer_internal::py_json_dumps;

std::string roundtrip(const std::string& text) {
  const auto v = parse_json_exact(text);
  EXPECT_FALSE(v.is_discarded()) << text;
  return py_json_dumps(v);
}

TEST(PyJson, IntegersOfAnySizeKeepTheirDigits) {
  EXPECT_EQ(roundtrip("123456789012345678901234567890"), "123456789012345678901234567890");
  EXPECT_EQ(roundtrip("-98765432109876543210"), "-98765432109876543210");
  EXPECT_EQ(roundtrip("18446744073709551615"), "18446744073709551615");  // uint64 max
  EXPECT_EQ(roundtrip("18446744073709551616"), "18446744073709551616");  // one past it
  EXPECT_EQ(roundtrip("-9223372036854775809"), "-9223372036854775809");  // one below int64 min
  EXPECT_EQ(roundtrip(R"({"a": [1, 99999999999999999999999, {"b": -7}], "c": "x"})"),
            R"({"a": [1, 99999999999999999999999, {"b": -7}], "c": "x"})");
}

TEST(PyJson, FloatsAsPythonReprAndStructureAsDumps) {
  EXPECT_EQ(roundtrip("1e3"), "1000.0");
  EXPECT_EQ(roundtrip("2.50"), "2.5");
  EXPECT_EQ(roundtrip("1e16"), "1e+16");
  EXPECT_EQ(roundtrip("0.0001"), "0.0001");
  EXPECT_EQ(roundtrip("0.00001"), "1e-05");
  EXPECT_EQ(roundtrip("123456789012345678901234567890.5"), "1.2345678901234568e+29");
  EXPECT_EQ(roundtrip(R"({"z":1,"a":[true,false,null],"é":"ü\n"})"),
            "{\"z\": 1, \"a\": [true, false, null], \"é\": \"ü\\n\"}");
  EXPECT_EQ(roundtrip("[]"), "[]");
  EXPECT_EQ(roundtrip("{}"), "{}");
}

TEST(PyJson, InvalidTextIsDiscarded) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "01", "1e", "\"\\x\"", "[1] 2"})
    EXPECT_TRUE(parse_json_exact(bad).is_discarded()) << bad;
}

}  // namespace
}  // namespace deepinfer
