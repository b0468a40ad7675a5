#include "ranks/serial.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace deepinfer::ranks {
namespace {

struct Row {
  int64_t seq_id;
  int32_t n_tokens;
  float temperature;
};

TEST(Serial, RoundTripsValuesVectorsAndStrings) {
  Writer w;
  w.put<int32_t>(-7);
  w.put(Row{42, 3, 0.5f});
  w.put_vector(std::vector<int32_t>{1, 2, 3});
  w.put_vector(std::vector<Row>{});
  w.put_string("héllo\0x");
  w.put_string("");
  w.put<double>(std::numeric_limits<double>::quiet_NaN());
  // 4 + 16 + (8 + 12) + 8 + (8 + 6) + 8 + 8: no padding, no alignment.
  EXPECT_EQ(w.bytes().size(), 4u + sizeof(Row) + 20 + 8 + 14 + 8 + 8);

  Reader r(w.bytes(), "step message");
  EXPECT_EQ(r.get<int32_t>(), -7);
  const Row row = r.get<Row>();
  EXPECT_EQ(row.seq_id, 42);
  EXPECT_EQ(row.n_tokens, 3);
  EXPECT_EQ(row.temperature, 0.5f);
  EXPECT_EQ(r.get_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(r.get_vector<Row>().empty());
  EXPECT_EQ(r.get_string(), "héllo");  // a string_view of a literal stops at its NUL
  EXPECT_EQ(r.get_string(), "");
  EXPECT_TRUE(std::isnan(r.get<double>()));
  EXPECT_TRUE(r.done());
  r.expect_end();
}

TEST(Serial, TakeLeavesTheWriterEmpty) {
  Writer w;
  w.put<uint8_t>(1);
  const std::vector<uint8_t> bytes = w.take();
  EXPECT_EQ(bytes.size(), 1u);
  w.put<uint8_t>(2);
  EXPECT_EQ(w.bytes(), std::vector<uint8_t>{2});
}

TEST(Serial, TruncatedMessagesThrowNamingTheMessage) {
  Writer w;
  w.put<int64_t>(5);
  w.put_vector(std::vector<float>{1, 2, 3});
  const std::vector<uint8_t> full = w.take();
  for (size_t cut = 0; cut < full.size(); ++cut) {
    std::vector<uint8_t> part(full.begin(), full.begin() + long(cut));
    Reader r(part, "step 9");
    try {
      r.get<int64_t>();
      r.get_vector<float>();
      FAIL() << "no error with " << cut << " of " << full.size() << " bytes";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("step 9"), std::string::npos) << e.what();
    }
  }
}

TEST(Serial, AHugeLengthIsRejectedBeforeAllocating) {
  Writer w;
  w.put<uint64_t>(std::numeric_limits<uint64_t>::max() / 2);  // a corrupt length prefix
  w.put<uint32_t>(0);
  Reader r(w.bytes(), "corrupt");
  try {
    r.get_vector<double>();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("claims"), std::string::npos) << e.what();
  }
  Reader s(w.bytes(), "corrupt");
  EXPECT_THROW(s.get_string(), Error);
}

TEST(Serial, LeftoverBytesAreAnError) {
  Writer w;
  w.put<int32_t>(1);
  w.put<int32_t>(2);
  Reader r(w.bytes(), "msg");
  r.get<int32_t>();
  EXPECT_FALSE(r.done());
  EXPECT_EQ(r.remaining(), 4u);
  EXPECT_THROW(r.expect_end(), Error);
}

}  // namespace
}  // namespace deepinfer::ranks
